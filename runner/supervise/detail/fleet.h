// The host fleet: every host's agent link, its decoder and outbox, heartbeats, the poll loop, the
// bounds on what a host sends and the one sanitiser of its text, and frame dispatch to a play.
// A play (run, doctor, watch, pull) decides what the frames mean and when its phase changes; the
// fleet knows no phases. Internal to supervise/.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "runner/protocol/protocol.h"
#include "runner/supervise/host_state.h"
#include "runner/supervise/supervisor.h"

namespace mltrain::supervise::detail {

struct FleetHost {
  const plan::HostPlan* plan = nullptr;
  HostStatus status;
  std::unique_ptr<transport::AgentLink> link;
  agent::Decoder decoder{agent::kMaxHostPayload};
  std::string outbox;
  std::string problem;  // why it failed
  Clock::time_point last_heard{};
  HostState state() const { return status.get(); }
  bool open() const { return link && !status.ended(); }
  const std::string& name() const { return plan->host.name; }
};

// What the connection threads hand back. Shared with them, so a play that ends while a host is
// still connecting need not wait: the thread finds `abandoned` and drops its link.
struct Connects {
  struct Result {
    size_t host = 0;
    std::unique_ptr<transport::AgentLink> link;
    std::string problem;
  };
  Connects();
  ~Connects();
  int ready_fd() const { return pipe[0]; }
  void put(Result r);          // from a connection thread
  std::vector<Result> take();  // on the loop
  void abandon();
  int pipe[2] = {-1, -1};
  std::mutex m;
  std::vector<Result> ready;
  bool abandoned = false;
};

class Fleet;

// The earliest of a play's deadlines.
struct Soonest {
  std::optional<Clock::time_point> t;
  void take(std::optional<Clock::time_point> d) {
    if (d && (!t || *d < *t)) t = d;
  }
};

// One command over the fleet. The fleet calls these from its loop; a play answers in its phase.
class Play {
 public:
  explicit Play(Fleet& fleet) : fleet_(fleet) {}
  virtual ~Play() = default;
  virtual bool finished() const = 0;
  virtual void on_timers(Clock::time_point now) = 0;
  virtual std::optional<Clock::time_point> next_deadline() const = 0;
  virtual void on_signal(int sig) = 0;                                  // SIGTSTP is the fleet's
  virtual void on_progress() = 0;                                       // a host connected, greeted or failed
  virtual void on_lost(size_t i, const std::string& why) = 0;           // its link broke or went silent
  virtual void on_frame(size_t i, uint32_t id, agent::Message& m) = 0;  // all but HelloAck, Bye, AgentError
  virtual void on_bye(size_t i);                                        // closed, by default
  virtual void on_agent_error(size_t i, const std::string& message);    // said on stderr by default
  virtual void on_greeted(size_t) {}                                    // its hello answered
  virtual void on_failed(size_t) {}                                     // its problem is set
  virtual void on_sent(size_t) {}                                       // bytes of host i's outbox went out
  virtual void on_resumed(Clock::time_point) {}  // this process was stopped: silence was ours
  // The loop's extras: one descriptor of the play's own (stdin, a viewer's stop) and its events.
  virtual int extra_fd() const { return -1; }
  virtual void on_extra(short) {}
  // Before each wait: whether to leave hosts' bytes unread (a console behind), and for how long
  // at most to wait.
  virtual bool hold_reads() { return false; }
  virtual std::chrono::milliseconds max_wait() { return std::chrono::milliseconds(1000); }
  virtual void flush() {}           // the console writes what it holds
  virtual void before_message() {}  // a line on stderr follows: the console makes room

 protected:
  Fleet& fleet_;
};

class Fleet {
 public:
  Fleet(plan::Plan& p, const Options& o, const TransportFor& tf);
  ~Fleet();
  Fleet(const Fleet&) = delete;
  Fleet& operator=(const Fleet&) = delete;

  // Runs the play's loop until it is finished; connections still opening are then abandoned.
  void drive(Play& play);

  Clock& clock() const { return clock_; }
  const Options& opts() const { return opts_; }
  size_t size() const { return hosts_.size(); }
  FleetHost& operator[](size_t i) { return hosts_[i]; }
  const FleetHost& operator[](size_t i) const { return hosts_[i]; }
  std::vector<FleetHost>& hosts() { return hosts_; }
  const std::vector<FleetHost>& hosts() const { return hosts_; }
  std::string describe(size_t i) const { return hosts_[i].link->describe(); }

  // Every host's transport opens on a thread of its own; `pings` keeps greeted agents' silence
  // windows open while slower hosts connect (doctor times its own ping instead).
  void connect_all(bool pings);
  // Past the connect deadline, fails every host not greeted yet (true then); else pings.
  bool connecting_timers(Clock::time_point now);
  Clock::time_point connect_deadline() const { return connect_deadline_; }

  void advance(size_t i, HostState to) { hosts_[i].status.advance(to); }
  void fail(size_t i, const std::string& problem);  // a host's problem before its ranks ran
  void lose(size_t i);                              // lost: its link is killed
  // Failed before its ranks ran, its link dropped; the play then sees whether it can move on.
  void fail_link(size_t i, const std::string& problem);
  bool all(HostState s) const;  // every host at s, or ended (failed, lost, closed)
  bool any_open() const;

  template <class M>
  void send(size_t i, const M& m, uint32_t id = 0) {
    if (hosts_[i].open()) agent::encode(hosts_[i].outbox, m, id);
  }
  template <class M>
  void send_all(const M& m, uint32_t id = 0) {
    for (size_t i = 0; i < hosts_.size(); ++i) send(i, m, id);
  }
  // A launcher->agent message came from a host: said in the log; anything else unwanted is dropped.
  void unexpected(size_t i, agent::Type t) const;

  // Heartbeats: a ping every interval to every greeted host; `heartbeats` also loses the hosts
  // silent past the timeout (the play's on_lost).
  void ping(Clock::time_point now);
  void heartbeats(Clock::time_point now);
  bool silent(size_t i, Clock::time_point now) const {
    return hosts_[i].open() && now - hosts_[i].last_heard >= opts_.heartbeat_timeout;
  }
  std::optional<Clock::time_point> next_ping() const { return next_ping_; }
  void start_pings();                                           // from now on, when not already
  std::optional<Clock::time_point> heartbeat_deadline() const;  // the next ping or silence
  void heard_from_all();

  // Goodbye: every agent told to shut down; done when all said bye, or after 3 s.
  void say_goodbye();
  bool goodbyes_done(Clock::time_point now) const;
  Clock::time_point goodbye_deadline() const { return goodbye_deadline_; }

  // Ctrl-Z: the agents told first (they would take the silence for a lost launcher), then stop.
  void pause();

 private:
  void wait(Clock::time_point until);
  void take_connected();
  void read_host(size_t i);
  void write_host(size_t i);
  void on_frame(size_t i, agent::Frame&& f);
  void greeted(size_t i, const agent::msg::HelloAck& m);

  plan::Plan& plan_;
  const Options& opts_;
  const TransportFor& transport_for_;
  Clock& clock_;
  SignalSource& signals_;
  Play* play_ = nullptr;
  std::vector<FleetHost> hosts_;
  std::shared_ptr<Connects> connects_;
  Clock::time_point connect_deadline_{};
  Clock::time_point goodbye_deadline_{};
  std::optional<Clock::time_point> next_ping_;
};

}  // namespace mltrain::supervise::detail
