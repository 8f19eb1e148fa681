// Merges the output of every rank into the console as prefixed lines and writes each rank's bytes,
// exactly as they came ('\r' included), to rank-N.log, a line of stdout or stderr at a time.
//
// On the console (docs/spec.md, "Console output"):
// - a partial line (no newline yet) is shown after kPartialDelay, and the rest of it continues it
//   when nothing else was printed in between (a `(Pdb) ` prompt stays on its line);
// - `\r` progress (tqdm): on a terminal, each rank's latest `\r` segment is a status line in an
//   area at the bottom, redrawn in place (at most every kRedraw) while completed lines scroll above
//   it; elsewhere only each line's final state is printed, plus its latest state every
//   kProgressEvery while it stays open;
// - control bytes are shown as \xNN on every line (colour codes pass); so is invalid UTF-8 on a
//   terminal, while into a pipe or a file it passes as it is (text::escape_console);
// - lines go out in the order they came, stdout's and stderr's alike; when the console's stdout and
//   stderr are one file (a terminal, `2>&1`) or there is no console, each rank writes both into one
//   pipe (one_stream()), so that order is the order the rank wrote in;
// - a line longer than kMaxLine is passed on in pieces so memory stays bounded under any output.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "runner/common/text.h"

namespace mltrain::supervise {

struct ConsoleOptions {
  bool color = false;
  bool timestamps = false;
  std::string prefix = "auto";         // "auto", "" or a template with {rank} {host} {local_rank} {node}
  std::optional<std::set<int>> ranks;  // console filter; files get everything
  bool quiet = false;                  // no rank output on the console at all (--detach)
};

// Writes to the console on a thread of its own, in the order given, so a console that drains
// slowly (a pipe into a paused pager, `| (sleep 30; cat)`) never blocks the launcher's loop: the
// loop keeps answering heartbeats and stops taking rank output while backlog() is high.
class ConsoleWriter {
 public:
  ConsoleWriter();
  ~ConsoleWriter();  // writes everything still queued first
  ConsoleWriter(const ConsoleWriter&) = delete;
  ConsoleWriter& operator=(const ConsoleWriter&) = delete;
  void put(int fd, std::string& bytes);  // takes the bytes (leaves `bytes` empty)
  // Waits until everything queued so far is written, at most `max`; true when it was.
  bool wait_written(std::chrono::milliseconds max);
  size_t backlog() const;

 private:
  void run();
  mutable std::mutex m_;
  std::condition_variable more_, written_;
  std::deque<std::pair<int, std::string>> queue_;
  size_t backlog_ = 0;  // queued plus being written
  bool stop_ = false;
  std::thread thread_;
};

struct RankInfo {
  int rank = 0;
  int local_rank = 0;
  int node = 0;
  std::string host;
};

class Output {
 public:
  static constexpr size_t kMaxLine = 1 << 20;
  static constexpr size_t kTailLines = 10;
  static constexpr std::chrono::milliseconds kPartialDelay{200};
  static constexpr std::chrono::milliseconds kRedraw{100};
  static constexpr std::chrono::milliseconds kProgressEvery{10000};

  // Opens (appends to) rank-N.log in `run_dir` for every rank. out_fd/err_fd: the console.
  Output(std::vector<RankInfo> ranks, bool multi_host, const std::string& run_dir, ConsoleOptions opts,
         int out_fd = 1, int err_fd = 2);
  ~Output();
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;

  // Bytes a rank wrote to stdout (stream 1) or stderr (stream 2).
  void data(int rank, int stream, std::string_view bytes);
  // The rank is gone: pass on any unterminated line.
  void finish(int rank);
  // An elastic restart placed the ranks anew (fewer of them, or on other hosts): their prefixes
  // follow. A rank keeps its file; ranks beyond `ranks` get no more output.
  void relabel(const std::vector<RankInfo>& ranks);
  // A line from mltrain itself into every rank file (e.g. a restart marker).
  void mark_all(const std::string& line);
  // Writes what is buffered (and partial lines now due) to the console and the files.
  void flush();
  // How long until flush() has something due (a partial line, a status redraw); the event loop
  // wakes by then. A large value when nothing waits.
  std::chrono::milliseconds due_in() const;
  // Readies the console for a line of mltrain's own on stderr: ends a partial line left open and
  // takes the status area away (the next flush draws it again).
  void before_message();
  // Input typed at the terminal (--stdin) ended a line there: an open partial line is over.
  void input_echoed();
  // On a terminal, the run's status line at the bottom, under the progress lines ("" for none);
  // redrawn with them. Elsewhere it is ignored.
  void set_status(std::string line);
  bool terminal() const { return tty_; }
  // Whether each rank's stdout and stderr should be one stream (agent Spawn::one_stream): the
  // console shows them in one place (its stdout and stderr are the same file) or not at all.
  bool one_stream() const { return one_stream_; }
  // The last lines a rank wrote (for the failure summary).
  std::vector<std::string> tail(int rank) const;
  std::string log_path(int rank) const;
  // The rank logs that are cut (a full disk): "PATH: ERROR (N bytes not written)" each.
  std::vector<std::string> cut_logs() const;
  // Console bytes not yet written (the console drains slowly); the loop stops taking rank output
  // above kConsoleBacklog.
  size_t console_backlog() const { return writer_ ? writer_->backlog() : 0; }
  // The loop stopped (true) or went back to (false) taking rank output. A partial line does not
  // age while held: what completes it may be waiting unread.
  void hold(bool on);
  static constexpr size_t kConsoleBacklog = 8u << 20;

 private:
  using Time = std::chrono::steady_clock::time_point;
  // One stream's line in progress, split at '\r': `seg` after the last one, `last` the latest
  // non-empty segment before it (what a terminal shows once `seg` is empty again).
  struct Stream {
    std::string seg, last;
    bool cr = false;       // the line has had a '\r': progress, not a partial line
    size_t shown = 0;      // bytes of seg already on the console as an open fragment
    Time since{};          // when seg got its first byte not yet shown
    Time printed{};        // not a terminal: when the progress state was last printed
    bool changed = false;  // the status line needs drawing
    std::string file;      // bytes since the last newline: the file gets whole lines of each stream
    bool pending() const { return !seg.empty() || !last.empty(); }
  };
  struct Rank {
    RankInfo info;
    int fd = -1;
    std::string file_buf;
    Stream streams[2];
    std::deque<std::string> tail;
    std::string prefix;      // rendered, with colour codes
    uint64_t file_end = 0;   // rank-N.log's size once file_buf is written
    std::string file_error;  // the first failed write of rank-N.log ("" while it is complete)
    uint64_t file_lost = 0;  // bytes that never reached it
    bool shown = true;
  };
  void label(size_t i, bool multi_host);  // rank i's prefix and whether the console shows it
  void feed(Rank& r, int s, std::string_view bytes);
  void end_line(Rank& r, int s);
  void show_fragment(Rank& r, int s);
  void close_fragment();
  // The console bytes for stream `s` (0 stdout, 1 stderr), after everything queued before them.
  std::string& console(int s);
  int fd_of(int s) const { return s == 1 ? err_fd_ : out_fd_; }
  // A rank's bytes as stream `s`'s console shows them (escaped for a terminal, or for a pipe).
  std::string shown(int s, std::string_view bytes) const;
  void queue_console();  // hands every pending piece to the writer, in order
  std::string line_start(const Rank& r) const;
  std::string status_area() const;
  // Writes what it can; returns how many bytes were written (errno says why when short).
  size_t write_all(int fd, std::string& buf);
  void to_console(int fd, std::string& buf);  // queues for the console writer; leaves buf empty
  void write_file(Rank& r);
  // Bytes for the rank's file; notes their arrival in the run's order file (`mltrain logs`
  // merges the rank files in that order).
  void to_file(Rank& r, std::string_view bytes);

  std::vector<Rank> ranks_;
  bool multi_host_ = false;
  std::string run_dir_;
  ConsoleOptions opts_;
  int out_fd_, err_fd_;
  // Console bytes not yet queued, in the order they came: (fd, bytes), one piece per run of the
  // same fd, so a stderr line between two stdout lines is written between them.
  std::vector<std::pair<int, std::string>> pending_;
  size_t pending_bytes_ = 0;  // the bytes of every piece but the last
  bool tty_ = false;          // out_fd is a terminal: status area for progress
  bool err_tty_ = false;
  bool one_stream_ = false;
  int drawn_ = 0;  // lines of status area on the terminal now
  bool status_changed_ = false;
  std::string status_line_;  // set_status's
  Time last_draw_{};
  // The (rank, stream) whose partial line is open on the console (cursor after it), or -1.
  int open_rank_ = -1, open_stream_ = 0;
  int order_fd_ = -1;
  std::string order_buf_;
  int order_last_rank_ = -1;
  bool held_ = false;
  std::unique_ptr<ConsoleWriter> writer_;  // last: it is gone (everything written) before the rest
};

using text::complete_utf8;
using text::escape_console;

// Renders a prefix template for a rank ("[{rank}]" -> "[3]").
std::string render_prefix(const std::string& tmpl, const RankInfo& r, bool multi_host);

}  // namespace mltrain::supervise
