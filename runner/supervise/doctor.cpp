#include "runner/supervise/doctor.h"

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
  // torch is checked with the interpreter the job runs: its program when that is a python, else
  // python3, each looked up in the PATH the ranks get.
  msg::Probe probe;
  probe.port = uint32_t(i == 0 ? doctor_port_ : 0);
  if (!plan_.argv.empty()) {
    const std::string& prog = plan_.argv[0];
    std::string base = prog.substr(prog.rfind('/') + 1);
    if (base.rfind("python", 0) == 0) probe.python = prog;
  }
  for (const auto& [k, v] : plan_.ranks[0].env)
    if (k == "PATH") probe.path = v;
  probe.nvml_library = plan_.nvml_library;
  probe.has_cuda_visible_devices = plan_.user_cuda_visible_devices ? 1 : 0;
  probe.cuda_visible_devices = plan_.user_cuda_visible_devices.value_or("");
  send_to(h, probe);
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
                "STATUS", "ARCH", "GLIBC", "GPUS", "NCCL", "PYTHON3", "TORCH", "CLOCK OFFSET", "PORT",
                "PROBLEM");
  out += line;
  for (const auto& r : reports) {
    char clock[32] = "-";
    if (r.ok || r.stage == "port") std::snprintf(clock, sizeof clock, "%+.0fms", r.clock_offset_ms);
    std::snprintf(line, sizeof line, "%-16s %-6s %-8s %-7s %-5s %-8s %-8s %-9s %-13s %-7s %s\n",
                  r.host.c_str(), r.ok ? "ok" : "FAIL", fact(r, "arch").c_str(), fact(r, "glibc").c_str(),
                  fact(r, "gpus").c_str(), fact(r, "nccl").c_str(), fact(r, "python3").c_str(),
                  fact(r, "torch").c_str(), clock,
                  r.facts.count("port_free") ? (r.facts.at("port_free") == "yes" ? "free" : "IN USE") : "-",
                  r.problem.empty() ? "" : (r.stage + ": " + r.problem).c_str());
    out += line;
  }
  for (const auto& r : reports)
    if (r.facts.count("python"))
      out += r.host + ": python3 and torch checked with " + r.facts.at("python") + "\n";
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
