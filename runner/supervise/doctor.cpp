#include "runner/supervise/doctor.h"

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/records/records.h"
#include "runner/supervise/detail/gang.h"

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

namespace detail {

namespace msg = mltrain::agent::msg;

void Gang::send_probes() {
  // A ping first: its round trip bounds how stale the host's clock reading is.
  for (auto& h : hosts_)
    if (h.state == HostState::greeted) {
      h.state = HostState::preparing;
      h.probing.ping_sent = clock_.now();
      send_to(h, msg::Ping{});
    }
  check_progress();
}

void Gang::on_probe_pong(size_t i) {
  Host& h = hosts_[i];
  if (h.state != HostState::preparing || h.probing.probe_sent_wall_ms != 0) return;
  h.probing.rtt_ms = std::chrono::duration<double, std::milli>(clock_.now() - h.probing.ping_sent).count();
  h.probing.probe_sent_wall_ms = wall_ms();
  // torch is checked with the interpreter the job runs: its program (a command line's first one)
  // when that is a python, else the python its #! line names, else python3, each found from the
  // ranks' folder in the PATH the ranks get. A PS server host runs no program.
  msg::Probe probe;
  probe.port = uint32_t(i == 0 ? doctor_port_ : 0);
  std::string prog = job_program();
  if (!plan_.hosts[i].ranks.empty() && !prog.empty()) {
    std::string base = prog.substr(prog.rfind('/') + 1);
    (base.rfind("python", 0) == 0 ? probe.python : probe.program) = prog;
  }
  probe.workdir = plan_.workdir;
  for (const auto& [k, v] : plan::rank_env(plan_, plan_.runtime, 0))
    if (k == "PATH") probe.path = v;
  probe.nvml_library = plan_.nvml_library;
  probe.has_cuda_visible_devices = plan_.user_cuda_visible_devices ? 1 : 0;
  probe.cuda_visible_devices = plan_.user_cuda_visible_devices.value_or("");
  send_to(h, probe);
}

std::string Gang::job_program() const {
  const auto& argv = plan_.argv;
  if (argv.size() >= 3 && argv[0] == "/bin/sh" && argv[1] == "-c") return first_program(argv[2]);
  return argv.empty() ? std::string() : argv[0];
}

void Gang::on(size_t i, uint32_t, msg::Probed& m) {
  Host& h = hosts_[i];
  if (phase_ != Phase::probing || h.state != HostState::preparing) return;
  h.probed = std::move(m);
  h.state = HostState::ready;
  check_progress();
}

std::vector<HostReport> Gang::doctor_reports() const {
  std::vector<HostReport> reports;
  for (size_t i = 0; i < hosts_.size(); ++i) {
    const Host& h = hosts_[i];
    HostReport r;
    r.host = h.plan->host.name;
    if (!h.probed) {
      r.problem = h.problem.empty() ? "not checked (interrupted)" : h.problem;
      r.stage = stage_of(r.problem);
      reports.push_back(r);
      continue;
    }
    for (const auto& kv : h.probed->facts) {
      auto eq = kv.find('=');
      if (eq != std::string::npos) r.facts[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    // The host read its clock first thing, about half a round trip after we sent the probe.
    if (auto t = r.facts.find("time_ms"); t != r.facts.end()) {
      r.clock_offset_ms = std::strtod(t->second.c_str(), nullptr) -
                          (double(h.probing.probe_sent_wall_ms) + h.probing.rtt_ms / 2);
      r.facts.erase(t);
    }
    r.rtt_ms = h.probing.rtt_ms;
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
      r.problem = "master port " + std::to_string(doctor_port_) + " is in use";
    }
    reports.push_back(r);
  }
  return reports;
}

int Gang::run_doctor(int master_port, std::vector<HostReport>& reports) {
  doctor_ = true;
  doctor_port_ = master_port;
  loop();
  reports = doctor_reports();
  return ending_ == Ending::none ? 0 : 128 + stop_signal_;
}

}  // namespace detail

int run_doctor(plan::Plan& plan, const Options& opts, const TransportFor& transport_for, int master_port,
               std::vector<HostReport>& reports) {
  records::RunRecord unused;  // doctor records no run
  detail::Gang g(plan, unused, opts, transport_for);
  return g.run_doctor(master_port, reports);
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
  for (const auto& r : reports)
    if (r.facts.count("python") && !r.facts.count("python_missing"))  // missing: the problem says it
      out += r.host + ": python and torch checked with " + r.facts.at("python") +
             (r.facts.count("python_from") ? " (" + r.facts.at("python_from") + ")" : std::string()) + "\n";
  // Which file each GPU library is, and which step of the search found it (knobs/gpu_library.h).
  for (const auto& r : reports)
    for (const auto& [key, label] : {std::pair<const char*, const char*>{"nccl_library", "NCCL"},
                                     {"cudart_library", "CUDA runtime"},
                                     {"nvml_library", "NVML"}})
      if (r.facts.count(key)) out += r.host + ": " + label + " " + r.facts.at(key) + "\n";
  // Each host's GPUs, one line each, or why it has none.
  for (const auto& r : reports) {
    if (!r.facts.count("gpus")) continue;
    std::string note = fact(r, "gpu_note");
    if (r.gpus.empty()) {
      out += r.host + ": no GPU (" + (note == "-" ? std::string("none found") : note) + ")\n";
      continue;
    }
    for (const auto& g : r.gpus) {
      std::snprintf(line, sizeof line, "%s: GPU %d: %s, %s, MIG %s, %s\n", r.host.c_str(), g.index,
                    g.name.empty() ? "unnamed" : g.name.c_str(),
                    g.memory_mib ? (std::to_string(g.memory_mib) + " MiB").c_str() : "memory unknown",
                    g.mig == 1   ? "on"
                    : g.mig == 0 ? "off"
                                 : "unknown",
                    g.uuid.empty() ? "-" : g.uuid.c_str());
      out += line;
    }
    std::string source = fact(r, "gpu_source");
    if (source == "nvidia-smi")
      out += r.host + ": GPUs listed by nvidia-smi -L" + (note == "-" ? std::string() : " (" + note + ")") +
             "\n";
    else if (note != "-")
      out += r.host + ": NVML: " + note + "\n";
    if (r.facts.count("cuda_visible_devices"))
      out += r.host + ": CUDA_VISIBLE_DEVICES=" + text::shell_quote(r.facts.at("cuda_visible_devices")) +
             " leaves " + fact(r, "gpus_usable") + " usable\n";
  }
  return out;
}

}  // namespace mltrain::supervise
