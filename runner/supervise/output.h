// Merges the output of every rank into the terminal as whole prefixed lines and writes each
// rank's lines to rank-N.log as they arrive. Partial lines wait for their newline; a line longer
// than kMaxLine is passed on in pieces so memory stays bounded under any output.
#pragma once

#include <deque>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::supervise {

struct ConsoleOptions {
  bool color = false;
  bool timestamps = false;
  std::string prefix = "auto";         // "auto", "" or a template with {rank} {host} {local_rank} {node}
  std::optional<std::set<int>> ranks;  // console filter; files get everything
  bool quiet = false;                  // no rank output on the console at all (--detach)
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
  // A line from mltrain itself into every rank file (e.g. a restart marker).
  void mark_all(const std::string& line);
  // Writes what is buffered to the console and the files.
  void flush();
  // The last lines a rank wrote (for the failure summary).
  std::vector<std::string> tail(int rank) const;
  std::string log_path(int rank) const;

 private:
  struct Stream {
    std::string partial;
  };
  struct Rank {
    RankInfo info;
    int fd = -1;
    std::string file_buf;
    Stream streams[2];
    std::deque<std::string> tail;
    std::string prefix;  // rendered, with colour codes
    bool shown = true;
  };
  void emit(Rank& r, int stream, std::string_view line, bool ended);
  void write_all(int fd, std::string& buf);

  std::vector<Rank> ranks_;
  std::string run_dir_;
  ConsoleOptions opts_;
  int out_fd_, err_fd_;
  std::string out_buf_, err_buf_;
};

// Renders a prefix template for a rank ("[{rank}]" -> "[3]").
std::string render_prefix(const std::string& tmpl, const RankInfo& r, bool multi_host);

}  // namespace mltrain::supervise
