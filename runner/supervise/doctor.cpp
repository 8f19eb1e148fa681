#include "runner/supervise/doctor.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <optional>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/status.h"
#include "runner/common/text.h"
#include "runner/records/records.h"
#include "runner/supervise/detail/fleet.h"
#include "runner/supervise/plays.h"

namespace mltrain::supervise {
namespace {

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string stage_of(const std::string& msg) {
  if (msg.find("host key") != std::string::npos || msg.find("HOST KEY") != std::string::npos)
    return "host key";
  if (msg.find("authentication") != std::string::npos) return "auth";
  if (msg.find("cannot connect") != std::string::npos) return "connect";
  return "agent";
}

// The program a shell command line runs first, as the shell would find its name: past variable
// assignments and `exec`/`env`/`command`, quotes removed; "" when it depends on the shell's
// expansions ($VAR, globs) or there is none.
std::string first_program(const std::string& line) {
  size_t i = 0;
  bool after_env = false;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    std::string word;
    bool quoted = false, assignment = false;
    for (; i < line.size(); ++i) {
      char c = line[i];
      if (c == ' ' || c == '\t' || c == '\n' || c == ';' || c == '&' || c == '|' || c == '<' || c == '>' ||
          c == '(' || c == ')')
        break;
      if (c == '$' || c == '`' || c == '*' || c == '?' || c == '[') return {};
      if (c == '\\' && i + 1 < line.size()) {
        word += line[++i];
        quoted = true;
      } else if (c == '\'' || c == '"') {
        size_t end = line.find(c, i + 1);
        if (end == std::string::npos) return {};
        std::string inside = line.substr(i + 1, end - i - 1);
        if (c == '"' && inside.find_first_of("$`\\") != std::string::npos) return {};
        word += inside;
        quoted = true;
        i = end;
      } else {
        if (c == '=' && !quoted && !word.empty() &&
            word.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_") ==
                std::string::npos &&
            !std::isdigit(static_cast<unsigned char>(word[0])))
          assignment = true;
        word += c;
      }
    }
    if (word.empty()) return {};
    if (assignment) continue;
    if (!quoted && (word == "exec" || word == "command" || word == "env")) {
      after_env = word == "env";
      continue;
    }
    if (after_env && !quoted && word[0] == '-') continue;  // env -u NAME is beyond this; -i is not
    return word;
  }
  return {};
}

// What doctor should do about a missing interpreter, by how the job names it.
std::string python_hint(const std::string& want, const std::string& workdir) {
  if (want.find('/') == std::string::npos)
    return "install it on the host, or set PATH in [run] env to the folder that holds it";
  if (want[0] == '/' || want[0] == '~')
    return "install it there, or point the job at an interpreter the host has";
  size_t bin = want.find("/bin/");
  return "a relative path is looked up from the ranks' workdir (" + workdir + "): create it there" +
         (bin == std::string::npos
              ? std::string()
              : " (for example in [setup]: python3 -m venv " + want.substr(0, bin) + ")") +
         ", or give an absolute path";
}

std::string fact(const HostReport& r, const char* k) {
  auto it = r.facts.find(k);
  return it == r.facts.end() ? "-" : it->second;
}

}  // namespace

namespace plays::doctor {

Phase next(Phase p, Event e) {
  static constexpr Transition<Phase, Event> kTable[] = {
      {Phase::connecting, Event::greeted, Phase::probing},  // a ping, then a probe, to every host
      {Phase::connecting, Event::signalled, Phase::done},   // hosts not yet checked say so
      {Phase::probing, Event::signalled, Phase::done},
      {Phase::probing, Event::probed, Phase::closing},  // every host answered, or failed
      {Phase::closing, Event::closed, Phase::done},
  };
  return lookup(kTable, p, e);
}

}  // namespace plays::doctor

namespace detail {

namespace msg = mltrain::agent::msg;

// Doctor's view of one host while probing: the ping's round trip, then the probe's facts.
struct Probing {
  Clock::time_point ping_sent{};
  double rtt_ms = 0;
  int64_t probe_sent_wall_ms = 0;
  std::optional<msg::Probed> probed;
};

class DoctorPlay final : public Play {
 public:
  using Phase = plays::doctor::Phase;
  using Event = plays::doctor::Event;
  DoctorPlay(Fleet& fleet, const plan::Plan& p, int master_port)
      : Play(fleet), plan_(p), port_(master_port), hosts_(fleet.size()) {}

  // Returns 0, or 128 + the signal that cut it short.
  int run(std::vector<HostReport>& reports) {
    fleet_.connect_all(false);  // no pings: the probe's own ping times the round trip
    fleet_.drive(*this);
    reports = this->reports();
    return stop_signal_ ? 128 + stop_signal_ : 0;
  }

  bool finished() const override { return phase_ == Phase::done; }

  void on_timers(Clock::time_point now) override {
    if (phase_ == Phase::connecting) {
      if (fleet_.connecting_timers(now)) on_progress();
    } else if (phase_ == Phase::probing && now >= probe_deadline_) {
      for (size_t i = 0; i < fleet_.size(); ++i)
        if (fleet_[i].state() != HostState::ready)
          fleet_.fail(i, "the agent did not answer the probe within " +
                             text::format_duration(std::chrono::duration_cast<std::chrono::milliseconds>(
                                 fleet_.opts().preflight_timeout)));
      on_progress();
    } else if (phase_ == Phase::closing && fleet_.goodbyes_done(now)) {
      step(Event::closed);
    }
  }

  std::optional<Clock::time_point> next_deadline() const override {
    switch (phase_) {
      case Phase::connecting:
        return fleet_.connect_deadline();
      case Phase::probing:
        return probe_deadline_;
      case Phase::closing:
        return fleet_.goodbye_deadline();
      case Phase::done:
        break;
    }
    return std::nullopt;
  }

  void on_signal(int sig) override {
    if (phase_ != Phase::connecting && phase_ != Phase::probing) return;
    stop_signal_ = sig;
    std::fprintf(stderr, "\nmltrain: %s during %s; hosts not yet checked are reported as such\n",
                 signal_name(sig).c_str(), phase_ == Phase::connecting ? "connecting" : "probing");
    step(Event::signalled);
  }

  void on_progress() override {
    if (phase_ == Phase::connecting && fleet_.all(HostState::greeted)) {
      log::info("supervise", "every agent answered");
      step(Event::greeted);
    } else if (phase_ == Phase::probing && fleet_.all(HostState::ready)) {
      step(Event::probed);
    }
  }

  void on_lost(size_t i, const std::string& why) override {
    if (!fleet_[i].open()) return;
    if (phase_ == Phase::closing || phase_ == Phase::done) return fleet_.lose(i);
    fleet_.fail_link(i, why);
  }

  void on_frame(size_t i, uint32_t, agent::Message& m) override {
    if (std::holds_alternative<msg::Pong>(m))
      on_pong(i);
    else if (auto* p = std::get_if<msg::Probed>(&m))
      on_probed(i, *p);
    else
      std::visit([&](const auto& x) { fleet_.unexpected(i, std::decay_t<decltype(x)>::kType); }, m);
  }

 private:
  void step(Event e) {
    if (!plays::follow_table(phase_, e, plays::doctor::next)) return;
    if (phase_ == Phase::probing) {
      probe_deadline_ = fleet_.clock().now() + fleet_.opts().preflight_timeout;
      send_probes();
    } else if (phase_ == Phase::closing) {
      fleet_.say_goodbye();
    }
  }

  void send_probes() {
    // A ping first: its round trip bounds how stale the host's clock reading is.
    for (size_t i = 0; i < fleet_.size(); ++i)
      if (fleet_[i].state() == HostState::greeted) {
        fleet_.advance(i, HostState::preparing);
        hosts_[i].ping_sent = fleet_.clock().now();
        fleet_.send(i, msg::Ping{});
      }
    on_progress();
  }

  void on_pong(size_t i) {
    Probing& h = hosts_[i];
    if (phase_ != Phase::probing || fleet_[i].state() != HostState::preparing || h.probe_sent_wall_ms != 0)
      return;
    h.rtt_ms = std::chrono::duration<double, std::milli>(fleet_.clock().now() - h.ping_sent).count();
    h.probe_sent_wall_ms = wall_ms();
    fleet_.send(i, probe_for(i));
  }

  // torch is checked with the interpreter the job runs: its program (a command line's first one)
  // when that is a python, else the python its #! line names, else python3, each found from the
  // ranks' folder in the PATH the ranks get. A PS server host runs no program.
  msg::Probe probe_for(size_t i) const {
    msg::Probe probe;
    probe.port = uint32_t(i == 0 ? port_ : 0);
    std::string prog = job_program();
    if (plan_.hosts[i].runs_program() && !prog.empty()) {
      std::string base = prog.substr(prog.rfind('/') + 1);
      (base.rfind("python", 0) == 0 ? probe.python : probe.program) = prog;
    }
    probe.workdir = plan_.workdir;
    for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, 0))
      if (k == "PATH") probe.path = v;
    probe.nvml_library = plan_.nvml_library;
    probe.has_cuda_visible_devices = plan_.user_cuda_visible_devices ? 1 : 0;
    probe.cuda_visible_devices = plan_.user_cuda_visible_devices.value_or("");
    return probe;
  }

  void on_probed(size_t i, msg::Probed& m) {
    if (phase_ != Phase::probing || fleet_[i].state() != HostState::preparing) return;
    hosts_[i].probed = std::move(m);
    fleet_.advance(i, HostState::ready);
    on_progress();
  }

  // The program the ranks run first (a command line's first word), "" when unknown.
  std::string job_program() const {
    const auto& argv = plan_.argv;
    if (argv.size() >= 3 && argv[0] == "/bin/sh" && argv[1] == "-c") return first_program(argv[2]);
    return argv.empty() ? std::string() : argv[0];
  }

  std::vector<HostReport> reports() const {
    std::vector<HostReport> out;
    for (size_t i = 0; i < fleet_.size(); ++i) out.push_back(report(i));
    return out;
  }

  HostReport report(size_t i) const {
    const Probing& h = hosts_[i];
    HostReport r;
    r.host = fleet_[i].name();
    if (!h.probed) {
      r.problem = fleet_[i].problem.empty() ? "not checked (interrupted)"
                                            : text::unnamed(fleet_[i].name(), fleet_[i].problem);
      r.stage = stage_of(r.problem);
      return r;
    }
    for (const auto& kv : h.probed->facts) {
      auto eq = kv.find('=');
      if (eq != std::string::npos) r.facts[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    // The host read its clock first thing, about half a round trip after we sent the probe.
    if (auto t = r.facts.find("time_ms"); t != r.facts.end()) {
      r.clock_offset_ms =
          std::strtod(t->second.c_str(), nullptr) - (double(h.probe_sent_wall_ms) + h.rtt_ms / 2);
      r.facts.erase(t);
    }
    r.rtt_ms = h.rtt_ms;
    r.gpus = h.probed->gpus;
    r.ok = true;
    if (auto missing = r.facts.find("python_missing"); missing != r.facts.end()) {
      // The job's own interpreter: its ranks could not start here.
      std::string want = missing->second.substr(0, missing->second.find(": "));  // "WANT: why"
      r.ok = false;
      r.stage = "python";
      r.problem = "the job's interpreter " + missing->second + "; hint: " + python_hint(want, plan_.workdir);
    }
    if (r.facts.count("port_free") && r.facts["port_free"] == "no") {
      r.ok = false;
      r.stage = "port";
      r.problem = "master port " + std::to_string(port_) + " is in use";
    }
    return r;
  }

  const plan::Plan& plan_;
  const int port_;  // tested free on the first host
  Phase phase_ = Phase::connecting;
  Clock::time_point probe_deadline_{};
  int stop_signal_ = 0;
  std::vector<Probing> hosts_;
};

}  // namespace detail

int run_doctor(plan::Plan& plan, const Options& opts, const TransportFor& transport_for, int master_port,
               std::vector<HostReport>& reports) {
  detail::Fleet fleet(plan, opts, transport_for);
  detail::DoctorPlay play(fleet, plan, master_port);
  return play.run(reports);
}

std::string format_doctor(const std::vector<HostReport>& reports, bool json) {
  if (json) {
    // docs/json.md, "doctor": facts typed (counts as numbers, yes/no as booleans, "not found" null).
    using J = nlohmann::ordered_json;
    auto typed = [](const std::string& k, const std::string& v) -> J {
      if (v.empty() || v == "not found") return nullptr;
      if (k == "cuda_visible_devices" || k == "gpu_note") return v;  // text, even when all digits
      if (v == "yes" || v == "no") return v == "yes";
      if (v.find_first_not_of("0123456789") == std::string::npos && v.size() < 10) return std::stoi(v);
      return v;
    };
    J a = J::array();
    for (const auto& r : reports) {
      const bool probed = !r.facts.empty();
      J facts = J::object();
      for (const auto& [k, v] : r.facts) facts[k] = typed(k, v);
      J gpus = J::array();
      for (const auto& g : r.gpus)
        gpus.push_back({{"index", g.index},
                        {"name", g.name},
                        {"uuid", g.uuid.empty() ? J(nullptr) : J(g.uuid)},
                        {"memory_mib", g.memory_mib ? J(g.memory_mib) : J(nullptr)},
                        {"mig", g.mig < 0 ? J(nullptr) : J(g.mig == 1)}});
      a.push_back({{"host", r.host},
                   {"ok", r.ok},
                   {"stage", r.stage.empty() ? J(nullptr) : J(r.stage)},
                   {"problem", r.problem.empty() ? J(nullptr) : J(r.problem)},
                   {"facts", facts},
                   {"gpus", gpus},
                   {"clock_offset_ms", probed ? J(r.clock_offset_ms) : J(nullptr)},
                   {"rtt_ms", probed ? J(r.rtt_ms) : J(nullptr)}});
    }
    return J{{"schema", records::kJsonSchema}, {"hosts", a}}.dump(2, ' ', false,
                                                                  J::error_handler_t::replace) +
           "\n";
  }
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%-16s %-6s %-8s %-7s %-5s %-8s %-8s %-9s %-13s %-7s %s\n", "HOST",
                "STATUS", "ARCH", "GLIBC", "GPUS", "NCCL", "PYTHON", "TORCH", "CLOCK OFFSET", "PORT",
                "PROBLEM");
  out += line;
  for (const auto& r : reports) {
    char clock[32] = "-";
    if (r.ok || r.stage == "port" || r.stage == "python")
      std::snprintf(clock, sizeof clock, "%+.0fms", r.clock_offset_ms);
    std::snprintf(line, sizeof line, "%-16s %-6s %-8s %-7s %-5s %-8s %-8s %-9s %-13s %-7s %s\n",
                  r.host.c_str(), r.ok ? "ok" : "FAIL", fact(r, "arch").c_str(), fact(r, "glibc").c_str(),
                  fact(r, "gpus").c_str(), fact(r, "nccl").c_str(), fact(r, "python3").c_str(),
                  fact(r, "torch").c_str(), clock,
                  r.facts.count("port_free") ? (r.facts.at("port_free") == "yes" ? "free" : "IN USE") : "-",
                  r.problem.empty() ? "" : (r.stage + ": " + r.problem).c_str());
    out += line;
  }
  // The lines below the table, each said once for all the hosts it holds for ("all 20 hosts:
  // no GPU (none found)"), in the order they first came.
  std::vector<std::pair<std::string, std::vector<std::string>>> notes;
  auto note = [&](const std::string& host, std::string what) {
    auto it = std::find_if(notes.begin(), notes.end(), [&](const auto& n) { return n.first == what; });
    if (it == notes.end()) it = notes.insert(notes.end(), {std::move(what), {}});
    it->second.push_back(host);
  };
  for (const auto& r : reports)
    if (r.facts.count("python") && !r.facts.count("python_missing"))  // missing: the problem says it
      note(r.host,
           "python and torch checked with " + r.facts.at("python") +
               (r.facts.count("python_from") ? " (" + r.facts.at("python_from") + ")" : std::string()));
  // Which file each GPU library is, and which step of the search found it (knobs/gpu_library.h).
  for (const auto& r : reports)
    for (const auto& [key, label] : {std::pair<const char*, const char*>{"nccl_library", "NCCL"},
                                     {"cudart_library", "CUDA runtime"},
                                     {"nvml_library", "NVML"}})
      if (r.facts.count(key)) note(r.host, std::string(label) + " " + r.facts.at(key));
  // Each host's GPUs, one line each, or why it has none.
  for (const auto& r : reports) {
    if (!r.facts.count("gpus")) continue;
    std::string gpu_note = fact(r, "gpu_note");
    if (r.gpus.empty()) {
      note(r.host, "no GPU (" + (gpu_note == "-" ? std::string("none found") : gpu_note) + ")");
      continue;
    }
    for (const auto& g : r.gpus) {
      std::snprintf(line, sizeof line, "GPU %d: %s, %s, MIG %s, %s", g.index,
                    g.name.empty() ? "unnamed" : g.name.c_str(),
                    g.memory_mib ? (std::to_string(g.memory_mib) + " MiB").c_str() : "memory unknown",
                    g.mig == 1   ? "on"
                    : g.mig == 0 ? "off"
                                 : "unknown",
                    g.uuid.empty() ? "-" : g.uuid.c_str());
      note(r.host, line);
    }
    std::string source = fact(r, "gpu_source");
    if (source == "nvidia-smi")
      note(r.host,
           "GPUs listed by nvidia-smi -L" + (gpu_note == "-" ? std::string() : " (" + gpu_note + ")"));
    else if (gpu_note != "-")
      note(r.host, "NVML: " + gpu_note);
    if (r.facts.count("cuda_visible_devices"))
      note(r.host, "CUDA_VISIBLE_DEVICES=" + text::shell_quote(r.facts.at("cuda_visible_devices")) +
                       " leaves " + fact(r, "gpus_usable") + " usable");
  }
  for (const auto& [what, hosts] : notes) {
    const std::string who = hosts.size() == reports.size() && hosts.size() > 3
                                ? "all " + std::to_string(hosts.size()) + " hosts"
                                : text::join(hosts, ", ");
    out += who + ": " + what + "\n";
  }
  return out;
}

}  // namespace mltrain::supervise
