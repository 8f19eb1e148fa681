#include "runner/supervise/output.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>

#include "runner/common/color.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/records/records.h"

namespace mltrain::supervise {

namespace {
constexpr size_t kFileFlushAt = 256 * 1024;
constexpr size_t kConsoleFlushAt = 1 << 20;

std::string timestamp() {
  timeval tv{};
  ::gettimeofday(&tv, nullptr);
  std::tm tm{};
  ::localtime_r(&tv.tv_sec, &tm);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02d:%02d:%02d.%03d ", tm.tm_hour, tm.tm_min, tm.tm_sec,
                int(tv.tv_usec / 1000));
  return buf;
}
// Writes all of `bytes` to `fd` (waiting while it would block); returns how many were written,
// fewer only when the file or console is gone or the disk full (errno says which).
size_t write_fully(int fd, std::string_view bytes) {
  size_t off = 0;
  while (fd >= 0 && off < bytes.size()) {
    ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n > 0) {
      off += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      if (n == 0) errno = ENOSPC;
      break;
    }
  }
  return off;
}

}  // namespace

ConsoleWriter::ConsoleWriter() : thread_([this] { run(); }) {}

ConsoleWriter::~ConsoleWriter() {
  {
    std::lock_guard<std::mutex> lock(m_);
    stop_ = true;
  }
  more_.notify_one();
  thread_.join();
}

void ConsoleWriter::put(int fd, std::string& bytes) {
  if (bytes.empty()) return;
  {
    std::lock_guard<std::mutex> lock(m_);
    backlog_ += bytes.size();
    if (!queue_.empty() && queue_.back().first == fd && queue_.back().second.size() < (1u << 20))
      queue_.back().second.append(bytes);
    else
      queue_.emplace_back(fd, std::move(bytes));
  }
  bytes.clear();
  more_.notify_one();
}

bool ConsoleWriter::wait_written(std::chrono::milliseconds max) {
  std::unique_lock<std::mutex> lock(m_);
  return written_.wait_for(lock, max, [this] { return backlog_ == 0; });
}

size_t ConsoleWriter::backlog() const {
  std::lock_guard<std::mutex> lock(m_);
  return backlog_;
}

void ConsoleWriter::run() {
  std::unique_lock<std::mutex> lock(m_);
  while (true) {
    more_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything is written
    auto [fd, bytes] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    write_fully(fd, bytes);  // short only when the console is gone: the rank files have everything
    lock.lock();
    backlog_ -= bytes.size();
    if (backlog_ == 0) written_.notify_all();
  }
}

std::string render_prefix(const std::string& tmpl, const RankInfo& r, bool multi_host) {
  return records::render_prefix(records::prefix_template(tmpl, multi_host), r.rank, r.local_rank, r.node,
                                r.host);
}

Output::Output(std::vector<RankInfo> ranks, bool multi_host, const std::string& run_dir, ConsoleOptions opts,
               int out_fd, int err_fd)
    : run_dir_(run_dir), opts_(std::move(opts)), out_fd_(out_fd), err_fd_(err_fd) {
  tty_ = !opts_.quiet && ::isatty(out_fd_) == 1;
  err_tty_ = !opts_.quiet && ::isatty(err_fd_) == 1;
  struct stat so {
  }, se{};
  one_stream_ = opts_.quiet || (::fstat(out_fd_, &so) == 0 && ::fstat(err_fd_, &se) == 0 &&
                                so.st_dev == se.st_dev && so.st_ino == se.st_ino);
  writer_ = std::make_unique<ConsoleWriter>();
  const std::string order = records::order_path_in(run_dir);
  order_fd_ = ::open(order.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (order_fd_ < 0) log::warn("output", "cannot open " + order + ": " + std::strerror(errno));
  ranks_.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks_[i];
    r.info = ranks[i];
    std::string path = log_path(r.info.rank);
    r.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (r.fd < 0) log::warn("output", "cannot open " + path + ": " + std::strerror(errno));
    struct stat st {};
    if (r.fd >= 0 && ::fstat(r.fd, &st) == 0) r.file_end = uint64_t(st.st_size);
    label(i, multi_host);
  }
  multi_host_ = multi_host;
}

void Output::label(size_t i, bool multi_host) {
  Rank& r = ranks_[i];
  std::string p = render_prefix(opts_.prefix, r.info, multi_host);
  r.prefix = p.empty()     ? std::string()
             : opts_.color ? std::string(rank_color(int(i))) + p + kColorReset + " "
                           : p + " ";
  r.shown = !opts_.quiet && (!opts_.ranks || opts_.ranks->count(r.info.rank));
}

void Output::relabel(const std::vector<RankInfo>& ranks) {
  for (size_t i = 0; i < ranks.size() && i < ranks_.size(); ++i) {
    if (ranks[i].rank != ranks_[i].info.rank) continue;  // rank N stays rank-N.log
    ranks_[i].info = ranks[i];
    label(i, multi_host_);
  }
}

Output::~Output() {
  for (auto& r : ranks_) {
    finish(r.info.rank);
  }
  flush();
  before_message();
  writer_.reset();  // everything on the console before the launcher goes on
  for (auto& r : ranks_)
    if (r.fd >= 0) ::close(r.fd);
  if (order_fd_ >= 0) ::close(order_fd_);
}

void Output::to_file(Rank& r, std::string_view bytes) {
  if (bytes.empty()) return;
  r.file_buf.append(bytes);
  r.file_end += bytes.size();
  // One entry per arrival, the same rank's consecutive arrivals in one (records::OrderEntry).
  constexpr size_t kEntry = sizeof(records::OrderEntry);
  if (order_buf_.size() >= kEntry && order_last_rank_ == r.info.rank)
    order_buf_.resize(order_buf_.size() - kEntry);
  records::OrderEntry e{uint32_t(r.info.rank), 0, r.file_end};
  order_buf_.append(reinterpret_cast<const char*>(&e), kEntry);
  order_last_rank_ = r.info.rank;
}

std::string Output::log_path(int rank) const { return run_dir_ + "/rank-" + std::to_string(rank) + ".log"; }

std::string& Output::console(int s) {
  const int fd = fd_of(s);
  if (pending_.empty() || pending_.back().first != fd) {
    if (!pending_.empty()) pending_bytes_ += pending_.back().second.size();
    pending_.emplace_back(fd, std::string());
  }
  return pending_.back().second;
}

std::string Output::shown(int s, std::string_view bytes) const {
  return text::escape_console(bytes, s == 1 ? err_tty_ : tty_);
}

void Output::queue_console() {
  for (auto& [fd, bytes] : pending_) to_console(fd, bytes);
  pending_.clear();
  pending_bytes_ = 0;
}

std::string Output::line_start(const Rank& r) const {
  return (opts_.timestamps ? timestamp() : std::string()) + r.prefix;
}

void Output::close_fragment() {
  if (open_rank_ < 0) return;
  console(open_stream_) += '\n';
  open_rank_ = -1;
}

void Output::end_line(Rank& r, int s) {
  Stream& st = r.streams[s];
  std::string_view seg = st.seg, vis = !st.seg.empty() ? st.seg : std::string_view(st.last);
  if (r.tail.size() == kTailLines) r.tail.pop_front();
  r.tail.push_back(text::escape_console(vis.substr(0, 4096)));  // for messages: escaped everywhere
  if (r.shown) {
    if (st.cr) status_changed_ = true;
    bool continues = !st.cr && st.shown > 0 && open_rank_ == r.info.rank && open_stream_ == s;
    if (continues) {
      console(s) += shown(s, seg.substr(st.shown)) + "\n";
      open_rank_ = -1;
    } else if (st.cr || st.shown == 0 || st.shown < seg.size()) {
      close_fragment();
      console(s) += line_start(r) + shown(s, st.cr ? vis : seg.substr(st.shown)) + "\n";
    }
    if (!pending_.empty() && pending_bytes_ + pending_.back().second.size() >= kConsoleFlushAt)
      queue_console();
  }
  std::string file = std::move(st.file);
  st = Stream{};
  st.file = std::move(file);
}

void Output::show_fragment(Rank& r, int s) {
  Stream& st = r.streams[s];
  size_t end = complete_utf8(st.seg);
  if (end <= st.shown) {
    st.since = std::chrono::steady_clock::now();  // only half a character: look again later
    return;
  }
  if (open_rank_ != r.info.rank || open_stream_ != s) {
    close_fragment();
    console(s) += line_start(r);
  }
  console(s) += shown(s, std::string_view(st.seg).substr(st.shown, end - st.shown));
  st.shown = end;
  open_rank_ = r.info.rank;
  open_stream_ = s;
}

void Output::feed(Rank& r, int s, std::string_view bytes) {
  Stream& st = r.streams[s];
  while (!bytes.empty()) {
    size_t k = bytes.find_first_of("\r\n");
    std::string_view piece = bytes.substr(0, k);
    if (!piece.empty()) {
      if (st.seg.size() == st.shown) st.since = std::chrono::steady_clock::now();
      st.seg.append(piece);
      if (st.cr) st.changed = status_changed_ = true;
      if (st.seg.size() >= kMaxLine) end_line(r, s);  // a piece of an overlong line
    }
    if (k == std::string_view::npos) break;
    if (bytes[k] == '\n') {
      end_line(r, s);
    } else {  // '\r': the line becomes progress; its latest segment is what a terminal shows
      if (open_rank_ == r.info.rank && open_stream_ == s) close_fragment();
      if (!st.seg.empty()) {
        st.last = std::move(st.seg);
        st.seg.clear();
      }
      st.shown = 0;
      st.cr = st.changed = status_changed_ = true;
    }
    bytes.remove_prefix(k + 1);
  }
}

void Output::data(int rank, int stream, std::string_view bytes) {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return;
  Rank& r = ranks_[size_t(rank)];
  // File: the rank's bytes exactly, whole lines so stdout and stderr do not tear each other.
  std::string& partial = r.streams[stream == 2 ? 1 : 0].file;
  size_t nl = bytes.rfind('\n');
  if (nl == std::string_view::npos) {
    partial.append(bytes);
    if (partial.size() >= kMaxLine) to_file(r, partial), partial.clear();
  } else {
    to_file(r, partial);
    partial.clear();
    to_file(r, bytes.substr(0, nl + 1));
    partial.append(bytes.substr(nl + 1));
  }
  if (r.file_buf.size() >= kFileFlushAt) write_file(r);
  feed(r, stream == 2 ? 1 : 0, bytes);
}

void Output::finish(int rank) {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return;
  Rank& r = ranks_[size_t(rank)];
  // No newline came: the file keeps the bytes as they were, the console ends the line.
  for (int s = 0; s < 2; ++s) {
    if (r.streams[s].pending()) end_line(r, s);
    to_file(r, r.streams[s].file);
    r.streams[s].file.clear();
  }
}

void Output::mark_all(const std::string& line) {
  for (auto& r : ranks_) {
    to_file(r, line + "\n");
  }
}

void Output::input_echoed() {
  open_rank_ = -1;           // the terminal's cursor went to a new line on its own
  if (drawn_ > 0) ++drawn_;  // and the status area is one line higher
}

void Output::set_status(std::string line) {
  if (!tty_ || line == status_line_) return;
  status_line_ = std::move(line);
  status_changed_ = true;
}

std::string Output::status_area() const {
  winsize w{};
  int cols = 80, rows = 24;
  if (::ioctl(out_fd_, TIOCGWINSZ, &w) == 0 && w.ws_col > 0) cols = w.ws_col, rows = w.ws_row;
  std::vector<std::string> lines;
  for (const auto& r : ranks_)
    for (const auto& st : r.streams)
      if (r.shown && st.cr && st.pending())
        lines.push_back(r.prefix + text::escape_console(!st.seg.empty() ? st.seg : st.last));
  size_t room = size_t(std::max(1, rows - 2 - (status_line_.empty() ? 0 : 1)));
  if (lines.size() > room) {
    size_t more = lines.size() - (room - 1);
    lines.resize(room - 1);
    lines.push_back("... and " + std::to_string(more) + " more in progress");
  }
  if (!status_line_.empty())
    lines.push_back(opts_.color ? "\x1b[2m" + status_line_ + "\x1b[0m" : status_line_);
  std::string area;
  for (const auto& l : lines) {
    // Cut to the width (a code point a column, colour codes none): a wrapped line would break
    // the count of lines the next redraw goes up.
    int n = 0;
    size_t i = 0;
    while (i < l.size() && n < cols - 1) {
      if (l[i] == '\x1b') {
        size_t m = l.find('m', i);
        i = m == std::string::npos ? l.size() : m + 1;
        continue;
      }
      ++i;
      while (i < l.size() && (static_cast<unsigned char>(l[i]) & 0xc0) == 0x80) ++i;
      ++n;
    }
    area.append(l, 0, i);
    if (l.find('\x1b') != std::string::npos) area += kColorReset;
    area += "\n";
  }
  return area;
}

std::chrono::milliseconds Output::due_in() const {
  using std::chrono::milliseconds;
  auto now = std::chrono::steady_clock::now();
  auto due = milliseconds(60000);
  auto take = [&](Time t) {
    auto d = std::chrono::duration_cast<milliseconds>(t - now);
    due = std::max(milliseconds(0), std::min(due, d));
  };
  for (const auto& r : ranks_) {
    if (!r.shown) continue;
    for (const auto& st : r.streams) {
      if (!held_ && !st.cr && st.seg.size() > st.shown) take(st.since + kPartialDelay);
      if (st.cr && !tty_ && st.changed) take(st.printed + kProgressEvery);
    }
  }
  if (tty_ && status_changed_ && open_rank_ < 0) take(last_draw_ + kRedraw);
  return due;
}

void Output::before_message() {
  close_fragment();
  queue_console();
  if (drawn_ > 0) {
    std::string erase = "\x1b[" + std::to_string(drawn_) + "F\x1b[J";
    to_console(out_fd_, erase);
    drawn_ = 0;
    status_changed_ = true;
  }
  // The caller prints on stderr next: after what is queued, unless the console is stuck.
  if (writer_) writer_->wait_written(std::chrono::milliseconds(2000));
}

void Output::hold(bool on) {
  if (held_ == on) return;
  held_ = on;
  if (on) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto& r : ranks_)
    for (auto& st : r.streams)
      if (st.seg.size() > st.shown) st.since = now;
}

void Output::to_console(int fd, std::string& buf) {
  if (fd < 0 || !writer_)
    buf.clear();
  else
    writer_->put(fd, buf);
}

void Output::write_file(Rank& r) {
  const size_t size = r.file_buf.size();
  const size_t written = write_all(r.fd, r.file_buf);
  if (written == size) return;
  // A full disk (or a file gone): the log is cut. Said once, counted, and reported at the end.
  const int e = errno;
  if (r.file_error.empty()) {
    r.file_error = log_path(r.info.rank) + ": " + (r.fd < 0 ? std::string("not open") : std::strerror(e));
    before_message();
    log::warn("output", "cannot write " + r.file_error + "; the rank's log is cut from here");
  }
  r.file_lost += size - written;
}

std::vector<std::string> Output::cut_logs() const {
  std::vector<std::string> out;
  for (const auto& r : ranks_)
    if (!r.file_error.empty())
      out.push_back(r.file_error + " (" + std::to_string(r.file_lost) + " bytes not written)");
  return out;
}

size_t Output::write_all(int fd, std::string& buf) {
  const size_t off = write_fully(fd, buf);
  const int e = errno;
  buf.clear();
  errno = e;
  return off;
}

void Output::flush() {
  auto now = std::chrono::steady_clock::now();
  for (auto& r : ranks_) {
    if (!r.shown) continue;
    for (int s = 0; s < 2; ++s) {
      Stream& st = r.streams[s];
      if (!held_ && !st.cr && st.seg.size() > st.shown && now - st.since >= kPartialDelay)
        show_fragment(r, s);
      if (st.cr && !tty_ && st.changed && now - st.printed >= kProgressEvery) {
        // Not a terminal: a progress line's latest state, now and then, as a line of its own.
        close_fragment();
        console(s) += line_start(r) + shown(s, !st.seg.empty() ? st.seg : st.last) + "\n";
        st.printed = now;
        st.changed = false;
      }
    }
  }
  bool lines = !pending_.empty();
  if (tty_ && (lines || drawn_ > 0 || status_changed_) &&
      (lines || (status_changed_ && now - last_draw_ >= kRedraw))) {
    // Erase the status area, print the lines above it, draw it again below them (not while a
    // partial line holds the cursor).
    std::string erase = drawn_ > 0 ? "\x1b[" + std::to_string(drawn_) + "F\x1b[J" : "";
    std::string area = open_rank_ < 0 ? status_area() : std::string();
    to_console(out_fd_, erase);
    queue_console();
    drawn_ = int(std::count(area.begin(), area.end(), '\n'));
    to_console(out_fd_, area);
    if (open_rank_ < 0) status_changed_ = false;
    last_draw_ = now;
  } else {
    queue_console();
  }
  // A console that keeps up sees it now; a slow one does not hold the loop.
  if (writer_) writer_->wait_written(std::chrono::milliseconds(20));
  for (auto& r : ranks_)
    if (!r.file_buf.empty()) write_file(r);
  // After the rank files: an entry never points past the bytes it orders.
  if (!order_buf_.empty()) write_all(order_fd_, order_buf_);
}

std::vector<std::string> Output::tail(int rank) const {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return {};
  const auto& t = ranks_[size_t(rank)].tail;
  return {t.begin(), t.end()};
}

}  // namespace mltrain::supervise
