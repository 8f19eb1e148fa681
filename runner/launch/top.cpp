// `mltrain top`: live telemetry of a run (its launcher's telemetry-live.jsonl) or of hosts this
// process connects to itself (supervise::run_watch on a thread of its own), shown as a full
// screen that redraws in place, as text snapshots for a pipe, or as one snapshot (--once, --json).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "knobs/gpu_library.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"
#include "runner/records/telemetry_log.h"
#include "runner/records/telemetry_view.h"
#include "runner/supervise/events.h"
#include "runner/supervise/watch.h"
#include "runner/telemetry/analysis.h"

namespace mltrain::launch {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Where samples come from. Both sides fill one Board under a lock.
class Source {
 public:
  virtual ~Source() = default;
  // Takes what arrived (reading the live file, for a run); false when the source has ended.
  virtual bool poll() = 0;
  // A descriptor that turns readable when something arrived (-1: poll on a timer).
  virtual int wake_fd() const { return -1; }
  virtual std::string title() const = 0;
  virtual std::string run_id() const { return {}; }
  virtual size_t expected_hosts() const = 0;
  virtual std::string note() const { return {}; }
  std::mutex m;
  telemetry::Board board;
  std::vector<std::pair<std::string, std::string>> problems;  // host, what went wrong
};

// A run's launcher rewrites telemetry-live.jsonl with each host's latest sample.
class LiveRun final : public Source {
 public:
  explicit LiveRun(records::RunRecord r) : rec_(std::move(r)) {
    path_ = records::run_dir(rec_.id) + "/" + records::kTelemetryLiveFile;
    std::vector<std::string> hosts;
    for (const auto& h : rec_.hosts) hosts.push_back(h.name);
    board.order(hosts);
  }
  bool poll() override {
    auto samples = records::read_telemetry(path_);
    std::lock_guard<std::mutex> lock(m);
    for (auto& [host, s] : samples) board.add(host, std::move(s));
    if (Clock::now() - last_status_ > std::chrono::seconds(1)) {
      last_status_ = Clock::now();
      rec_ = records::load(rec_.id);
    }
    return rec_.status == "running" && records::launcher_alive(rec_);
  }
  std::string title() const override {
    return "run " + rec_.id + " (" + (rec_.status == "running" ? "running" : rec_.status) + ")";
  }
  std::string run_id() const override { return rec_.id; }
  size_t expected_hosts() const override { return rec_.hosts.size(); }
  std::string note() const override {
    if (rec_.status != "running")
      return "the run ended (" + rec_.status + "); 'mltrain show " + rec_.id +
             "' has its utilization summary";
    return {};
  }
  const records::RunRecord& record() const { return rec_; }

 private:
  records::RunRecord rec_;
  std::string path_;
  Clock::time_point last_status_ = Clock::now();
};

// Agents started by this process on the hosts, on a thread that runs the gang's watch loop.
class Watch final : public Source {
 public:
  Watch(plan::Plan plan, const spec::JobSpec& s, std::string title, milliseconds interval)
      : plan_(std::move(plan)), title_(std::move(title)) {
    if (::pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0 || ::pipe2(stop_, O_CLOEXEC | O_NONBLOCK) != 0)
      throw Error(std::string("pipe: ") + std::strerror(errno), {}, exit_code::internal);
    w_.interval = interval;
    // The job's MLTRAIN_NVML_LIBRARY, else this process's (a path every host has), else the agents' own.
    w_.nvml_library = knobs::library_setting(knobs::GpuLibrary::nvml, plan_.nvml_library);
    w_.stop_fd = stop_[0];
    std::vector<std::string> hosts;
    for (const auto& h : plan_.hosts) hosts.push_back(h.host.name);
    board.order(hosts);
    w_.on_sample = [this](const std::string& host, std::string_view text) {
      telemetry::Sample sample;
      std::string error;
      if (!telemetry::decode(text, sample, error)) return true;
      {
        std::lock_guard<std::mutex> lock(m);
        board.add(host, std::move(sample));
      }
      wake();
      return true;
    };
    w_.on_problem = [this](const std::string& host, const std::string& problem) {
      {
        std::lock_guard<std::mutex> lock(m);
        problems.emplace_back(host, problem);
      }
      wake();
    };
    const supervise::TransportFor& tf = detail::lasting_transports(s).for_host();
    thread_ = std::thread([this, &tf] {
      try {
        code_ = supervise::run_watch(plan_, detail::supervise_defaults(), tf, w_);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(m);
        problems.emplace_back("mltrain", e.what());
      }
      done_ = true;
      wake();
    });
  }
  ~Watch() override {
    stop();
    if (thread_.joinable()) thread_.join();
    for (int fd : {wake_[0], wake_[1], stop_[0], stop_[1]}) ::close(fd);
  }
  void stop() {
    char b = 1;
    [[maybe_unused]] ssize_t n = ::write(stop_[1], &b, 1);
  }
  bool poll() override {
    char buf[256];
    while (::read(wake_[0], buf, sizeof buf) > 0) {
    }
    return !done_;
  }
  int wake_fd() const override { return wake_[0]; }
  std::string title() const override { return title_; }
  size_t expected_hosts() const override { return plan_.hosts.size(); }
  int code() const { return code_; }

 private:
  void wake() {
    char b = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
  }
  plan::Plan plan_;
  std::string title_;
  supervise::WatchOptions w_;
  int wake_[2] = {-1, -1}, stop_[2] = {-1, -1};
  std::thread thread_;
  std::atomic<bool> done_{false};
  std::atomic<int> code_{0};
};

// Every expected host either sent two samples (rates known) or failed.
bool complete(Source& src) {
  std::lock_guard<std::mutex> lock(src.m);
  return src.board.hosts_with_rates() + src.problems.size() >= src.expected_hosts();
}

std::string problems_text(Source& src) {
  std::lock_guard<std::mutex> lock(src.m);
  std::string out;
  for (const auto& [host, p] : src.problems) out += host + ": " + p + "\n";
  return out;
}

std::string json_with_problems(Source& src, const telemetry::Snapshot& snap) {
  std::lock_guard<std::mutex> lock(src.m);
  return records::snapshot_json(snap, src.run_id(), src.problems);
}

telemetry::Snapshot snapshot(Source& src) {
  std::lock_guard<std::mutex> lock(src.m);
  return src.board.snapshot();
}

// One snapshot once every host has two samples (or failed), or when `limit` passed.
int run_once(Source& src, const TopRequest& req, milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  bool alive = true;
  while (alive && !complete(src) && Clock::now() < deadline) {
    pollfd p{src.wake_fd(), POLLIN, 0};
    ::poll(&p, 1, src.wake_fd() >= 0 ? 200 : 100);
    alive = src.poll();
  }
  src.poll();
  telemetry::Snapshot snap = snapshot(src);
  if (req.json) {
    std::fputs(json_with_problems(src, snap).c_str(), stdout);
  } else {
    records::TopScreen screen;
    screen.width = 0;
    screen.title = src.title();
    screen.note = src.note();
    std::fputs(records::render_top(snap, screen).c_str(), stdout);
  }
  std::string problems = problems_text(src);
  if (!problems.empty()) std::fprintf(stderr, "mltrain top: hosts not watched:\n%s", problems.c_str());
  if (snap.hosts.empty())
    throw Error("no telemetry arrived within " + text::format_duration(limit),
                src.run_id().empty() ? "check the hosts with 'mltrain doctor'"
                                     : "is telemetry off for this run (MLTRAIN_TELEMETRY_INTERVAL=0)?",
                exit_code::host_failure);
  return problems.empty() ? 0 : exit_code::host_failure;
}

// The terminal in raw mode on the alternate screen while this lives; restored on every way out.
class RawTerminal {
 public:
  RawTerminal() {
    if (::tcgetattr(0, &saved_) != 0) return;
    termios raw = saved_;
    raw.c_lflag &= tcflag_t(~(ICANON | ECHO | ISIG | IEXTEN));
    raw.c_iflag &= tcflag_t(~(IXON | ICRNL));
    raw.c_cc[VMIN] = 0;
    raw.c_cc[VTIME] = 0;
    ::tcsetattr(0, TCSAFLUSH, &raw);
    active_ = true;
    write_all("\033[?1049h\033[?25l\033[H\033[2J");
  }
  ~RawTerminal() {
    if (!active_) return;
    write_all("\033[?25h\033[?1049l");
    ::tcsetattr(0, TCSAFLUSH, &saved_);
  }
  static void write_all(const std::string& s) {
    size_t done = 0;
    while (done < s.size()) {
      ssize_t n = ::write(1, s.data() + done, s.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      done += size_t(n);
    }
  }

 private:
  termios saved_{};
  bool active_ = false;
};

void on_winch(int) {}

const char* view_name(records::TopView v) {
  switch (v) {
    case records::TopView::all:
      return "all";
    case records::TopView::hosts:
      return "hosts";
    case records::TopView::gpus:
      return "GPUs";
    case records::TopView::ranks:
      return "ranks";
  }
  return "?";
}

int run_screen(Source& src, const TopRequest& req) {
  supervise::SignalSource& signals = supervise::process_signals();
  struct sigaction sa {};
  sa.sa_handler = on_winch;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGWINCH, &sa, nullptr);  // no SA_RESTART: poll returns, the screen is redrawn
  RawTerminal term;
  records::TopScreen screen;
  screen.color = req.color;
  auto next = Clock::now();
  bool quit = false;
  while (!quit) {
    bool alive = src.poll();
    winsize ws{};
    if (::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
      screen.width = ws.ws_col, screen.height = ws.ws_row;
    screen.title = src.title();
    screen.note = src.note();
    std::string problems = problems_text(src);
    if (!problems.empty())
      screen.note += (screen.note.empty() ? "" : "; ") + problems.substr(0, problems.find('\n'));
    if (!alive && src.run_id().empty()) screen.note = "watching ended; " + screen.note;
    {
      std::lock_guard<std::mutex> lock(src.m);
      if (src.board.empty()) screen.note = "waiting for the first samples...";
    }
    screen.footer = std::string("q quit  a all  h hosts  g GPUs  r ranks  s sort (") +
                    records::sort_name(screen.sort) + ")  view: " + view_name(screen.view);
    std::string frame = records::render_top(snapshot(src), screen);
    // In place: every line cleared to its end, the rest of the screen cleared, no scrolling.
    std::string out = "\033[H";
    size_t at = 0;
    while (at < frame.size()) {
      size_t nl = frame.find('\n', at);
      std::string line = frame.substr(at, nl - at);
      at = nl == std::string::npos ? frame.size() : nl + 1;
      out += line + "\033[K" + (at < frame.size() ? "\r\n" : "");
    }
    out += "\033[J";
    RawTerminal::write_all(out);
    next = Clock::now() + req.interval;
    // Wait for a key, a sample, a signal, a resize or the next refresh.
    while (!quit) {
      auto left = std::chrono::duration_cast<milliseconds>(next - Clock::now()).count();
      if (left <= 0) break;
      pollfd fds[3] = {{0, POLLIN, 0}, {signals.fd(), POLLIN, 0}, {src.wake_fd(), POLLIN, 0}};
      int rc = ::poll(fds, 3, int(std::min<int64_t>(left, 1000)));
      if (rc < 0 && errno == EINTR) break;  // SIGWINCH: redraw now
      if (fds[1].revents & POLLIN) {
        for (int sig : signals.take())
          if (sig != SIGTSTP) quit = true;
      }
      if (fds[0].revents & (POLLHUP | POLLERR)) quit = true;
      if (fds[0].revents & POLLIN) {
        char keys[64];
        ssize_t n = ::read(0, keys, sizeof keys);
        for (ssize_t k = 0; k < n; ++k) {
          switch (keys[k]) {
            case 'q':
            case 'Q':
            case 3:    // Ctrl-C (the terminal sends it as a byte in raw mode)
            case 4:    // Ctrl-D
            case 033:  // Esc
              quit = true;
              break;
            case 'a':
              screen.view = records::TopView::all;
              break;
            case 'h':
              screen.view = records::TopView::hosts;
              break;
            case 'g':
              screen.view = records::TopView::gpus;
              break;
            case 'r':
              screen.view = records::TopView::ranks;
              break;
            case 's':
              screen.sort = records::TopSort((int(screen.sort) + 1) % 5);
              break;
            default:
              break;
          }
        }
        break;  // redraw for the key at once
      }
      if (fds[2].revents & POLLIN) {
        src.poll();  // drain; the screen refreshes on its interval
      }
    }
  }
  return 0;
}

// Text snapshots one after another, for a pipe (as `top -b`).
int run_batch(Source& src, const TopRequest& req) {
  supervise::SignalSource& signals = supervise::process_signals();
  records::TopScreen screen;
  screen.width = 0;
  bool alive = true;
  while (alive) {
    auto next = Clock::now() + req.interval;
    while (Clock::now() < next) {
      pollfd fds[2] = {{signals.fd(), POLLIN, 0}, {src.wake_fd(), POLLIN, 0}};
      ::poll(
          fds, 2,
          int(std::max<int64_t>(1, std::chrono::duration_cast<milliseconds>(next - Clock::now()).count())));
      if ((fds[0].revents & POLLIN) && !signals.take().empty()) return 0;
      if (fds[1].revents & POLLIN) src.poll();
    }
    alive = src.poll();
    screen.title = src.title();
    screen.note = src.note();
    std::string frame = records::render_top(snapshot(src), screen);
    std::fputs((frame + "\n").c_str(), stdout);
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace

int top(const TopRequest& req) {
  if (req.interval < milliseconds(100))
    throw Error("--interval " + text::format_duration(req.interval) + " is too short", "give 100ms or more");
  // What to watch: a run named (or the newest one running), else the hosts of a spec or the flags.
  const Overrides& o = req.job.overrides;
  const bool hosts_given = !o.hostfile.empty() || o.hosts.has_value();
  std::string spec_path;
  if (!req.target.empty()) {
    const std::string& t = req.target;
    if ((t.size() > 5 && t.compare(t.size() - 5, 5, ".toml") == 0) || ::access(t.c_str(), F_OK) == 0)
      spec_path = req.target;
  }
  std::unique_ptr<Source> src;
  if (!req.target.empty() && spec_path.empty()) {
    if (hosts_given) throw Error("give a run or hosts (--hostfile, -H), not both", "mltrain top --help");
    records::RunRecord r = records::load(records::resolve(req.target));
    if (r.status != "running" || !records::launcher_alive(r))
      throw Error("run " + r.id + " is not running (" + (r.status == "running" ? "lost" : r.status) + ")",
                  "'mltrain show " + r.id + "' prints its utilization over the run");
    src = std::make_unique<LiveRun>(std::move(r));
  } else if (req.target.empty() && !hosts_given) {
    // The newest run still running, when there is one.
    auto runs = records::list();
    for (auto it = runs.rbegin(); it != runs.rend() && !src; ++it)
      if (it->status == "running" && records::launcher_alive(*it)) src = std::make_unique<LiveRun>(*it);
  }
  if (!src) {
    JobRequest j = req.job;
    if (!spec_path.empty()) j.specs = {spec_path};
    j.command = std::vector<std::string>{"true"};  // top runs nothing
    spec::JobSpec s = resolve_spec(j);
    plan::Plan p = plan::make_plan(s, detail::plan_inputs(j, "top", "top", detail::Ports::placeholder));
    std::string title = !spec_path.empty()                        ? "hosts of " + spec_path
                        : !o.hostfile.empty()                     ? "hosts of " + o.hostfile
                        : p.hosts.size() == 1 && p.hosts[0].local ? "this host"
                                                                  : std::to_string(p.hosts.size()) + " hosts";
    src = std::make_unique<Watch>(std::move(p), s, title, req.interval);
  }
  src->poll();
  if (req.once || req.json) {
    // Connections (SSH, the agent's first upload) take their time; samples then come each interval.
    milliseconds limit = src->run_id().empty() ? milliseconds(30000) + 3 * req.interval : 3 * req.interval;
    return run_once(*src, req, std::max(limit, milliseconds(3000)));
  }
  if (::isatty(0) == 1 && ::isatty(1) == 1) return run_screen(*src, req);
  return run_batch(*src, req);
}

}  // namespace mltrain::launch
