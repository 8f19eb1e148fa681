#include "runner/supervise/output.h"

#include <fcntl.h>
#include <sys/select.h>
#include <sys/time.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <ctime>

#include "runner/common/color.h"
#include "runner/common/log.h"

namespace mltrain::supervise {

namespace {
constexpr size_t kFileFlushAt = 256 * 1024;
constexpr size_t kConsoleFlushAt = 1 << 20;

void replace_all(std::string& s, std::string_view what, const std::string& with) {
  for (size_t pos = 0; (pos = s.find(what, pos)) != std::string::npos; pos += with.size())
    s.replace(pos, what.size(), with);
}

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
}  // namespace

std::string render_prefix(const std::string& tmpl, const RankInfo& r, bool multi_host) {
  if (tmpl.empty()) return {};
  std::string s = tmpl == "auto" ? (multi_host ? "[{host}:{rank}]" : "[{rank}]") : tmpl;
  replace_all(s, "{rank}", std::to_string(r.rank));
  replace_all(s, "{local_rank}", std::to_string(r.local_rank));
  replace_all(s, "{node}", std::to_string(r.node));
  replace_all(s, "{host}", r.host);
  return s;
}

Output::Output(std::vector<RankInfo> ranks, bool multi_host, const std::string& run_dir, ConsoleOptions opts,
               int out_fd, int err_fd)
    : run_dir_(run_dir), opts_(std::move(opts)), out_fd_(out_fd), err_fd_(err_fd) {
  ranks_.resize(ranks.size());
  for (size_t i = 0; i < ranks.size(); ++i) {
    Rank& r = ranks_[i];
    r.info = ranks[i];
    std::string path = log_path(r.info.rank);
    r.fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (r.fd < 0) log::warn("output", "cannot open " + path + ": " + std::strerror(errno));
    std::string p = render_prefix(opts_.prefix, r.info, multi_host);
    if (!p.empty()) {
      r.prefix = opts_.color ? std::string(rank_color(int(i))) + p + kColorReset + " " : p + " ";
    }
    r.shown = !opts_.quiet && (!opts_.ranks || opts_.ranks->count(r.info.rank));
  }
}

Output::~Output() {
  for (auto& r : ranks_) {
    finish(r.info.rank);
  }
  flush();
  for (auto& r : ranks_)
    if (r.fd >= 0) ::close(r.fd);
}

std::string Output::log_path(int rank) const { return run_dir_ + "/rank-" + std::to_string(rank) + ".log"; }

void Output::emit(Rank& r, int stream, std::string_view line, bool ended) {
  // File: the rank's bytes exactly (a piece of an overlong line has no newline of its own).
  r.file_buf.append(line);
  if (ended) r.file_buf.push_back('\n');
  if (r.file_buf.size() >= kFileFlushAt) write_all(r.fd, r.file_buf);

  std::string t(line.substr(0, 4096));
  if (r.tail.size() == kTailLines) r.tail.pop_front();
  r.tail.push_back(std::move(t));

  if (!r.shown) return;
  std::string& out = stream == 2 ? err_buf_ : out_buf_;
  if (opts_.timestamps) out += timestamp();
  out += r.prefix;
  out.append(line);
  out.push_back('\n');
  if (out.size() >= kConsoleFlushAt) write_all(stream == 2 ? err_fd_ : out_fd_, out);
}

void Output::data(int rank, int stream, std::string_view bytes) {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return;
  Rank& r = ranks_[size_t(rank)];
  int s = stream == 2 ? 1 : 0;
  std::string& partial = r.streams[s].partial;
  while (!bytes.empty()) {
    size_t nl = bytes.find('\n');
    if (nl == std::string_view::npos) {
      partial.append(bytes);
      while (partial.size() >= kMaxLine) {
        emit(r, stream, std::string_view(partial).substr(0, kMaxLine), false);
        partial.erase(0, kMaxLine);
      }
      return;
    }
    if (partial.empty()) {
      emit(r, stream, bytes.substr(0, nl), true);
    } else {
      partial.append(bytes.substr(0, nl));
      emit(r, stream, partial, true);
      partial.clear();
    }
    bytes.remove_prefix(nl + 1);
  }
}

void Output::finish(int rank) {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return;
  Rank& r = ranks_[size_t(rank)];
  for (int s = 0; s < 2; ++s) {
    if (!r.streams[s].partial.empty()) {
      // No newline came: the file keeps the bytes as they were, the console ends the line.
      std::string last = std::move(r.streams[s].partial);
      r.streams[s].partial.clear();
      r.file_buf += last;
      if (r.tail.size() == kTailLines) r.tail.pop_front();
      r.tail.push_back(last.substr(0, 4096));
      if (r.shown) {
        std::string& out = s == 1 ? err_buf_ : out_buf_;
        if (opts_.timestamps) out += timestamp();
        out += r.prefix + last + "\n";
      }
    }
  }
}

void Output::mark_all(const std::string& line) {
  for (auto& r : ranks_) {
    r.file_buf += line + "\n";
  }
}

void Output::write_all(int fd, std::string& buf) {
  size_t off = 0;
  while (fd >= 0 && off < buf.size()) {
    ssize_t n = ::write(fd, buf.data() + off, buf.size() - off);
    if (n > 0) {
      off += size_t(n);
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      fd_set w;
      FD_ZERO(&w);
      FD_SET(fd, &w);
      ::select(fd + 1, nullptr, &w, nullptr, nullptr);
      continue;
    } else {
      break;  // the console or file is gone: keep running, drop this copy
    }
  }
  buf.clear();
}

void Output::flush() {
  write_all(out_fd_, out_buf_);
  write_all(err_fd_, err_buf_);
  for (auto& r : ranks_)
    if (!r.file_buf.empty()) write_all(r.fd, r.file_buf);
}

std::vector<std::string> Output::tail(int rank) const {
  if (rank < 0 || size_t(rank) >= ranks_.size()) return {};
  const auto& t = ranks_[size_t(rank)].tail;
  return {t.begin(), t.end()};
}

}  // namespace mltrain::supervise
