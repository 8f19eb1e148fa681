#include "runner/supervise/doctor.h"

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "runner/agent/protocol.h"
#include "runner/common/error.h"

namespace mltrain::supervise {
namespace {

namespace proto = mltrain::agent;
using Clock = std::chrono::steady_clock;

int64_t wall_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool write_all(int fd, const std::string& data) {
  size_t off = 0;
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (off < data.size() && Clock::now() < deadline) {
    ssize_t n = ::write(fd, data.data() + off, data.size() - off);
    if (n > 0)
      off += size_t(n);
    else if (n < 0 && errno != EAGAIN && errno != EINTR)
      return false;
    else {
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, 100);
    }
  }
  return off == data.size();
}

// Sends `request` and reads frames until a message of type M arrives (30 s at most); nullopt
// when the agent closes, sends a malformed frame or does not answer.
template <class M>
std::optional<M> ask(transport::AgentLink& link, proto::Decoder& d, const auto& request) {
  std::string out;
  proto::encode(out, request);
  if (!write_all(link.write_fd(), out)) return std::nullopt;
  auto deadline = Clock::now() + std::chrono::seconds(30);
  proto::Frame f;
  while (Clock::now() < deadline) {
    while (d.next(f)) {
      if (f.type != M::kType) continue;
      std::string error;
      auto m = proto::decode(std::move(f), error);
      if (!m) return std::nullopt;
      return std::get<M>(std::move(*m));
    }
    if (d.corrupt()) return std::nullopt;
    pollfd p{link.read_fd(), POLLIN, 0};
    if (::poll(&p, 1, 200) <= 0) continue;
    char buf[65536];
    ssize_t n = ::read(link.read_fd(), buf, sizeof buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) return std::nullopt;
    if (n > 0) d.feed(buf, size_t(n));
  }
  return std::nullopt;
}

std::string stage_of(const std::string& msg) {
  if (msg.find("host key") != std::string::npos || msg.find("HOST KEY") != std::string::npos)
    return "host key";
  if (msg.find("authentication") != std::string::npos) return "auth";
  if (msg.find("cannot connect") != std::string::npos) return "connect";
  return "agent";
}

HostReport check_host(const plan::HostPlan& h, const TransportFor& tf, int port) {
  HostReport r;
  r.host = h.host.name;
  std::unique_ptr<transport::AgentLink> link;
  try {
    link = tf(h).connect(h);
  } catch (const Error& e) {
    r.problem = e.what();
    r.stage = stage_of(r.problem);
    return r;
  }
  proto::Decoder d;
  proto::msg::Hello hello;
  hello.grace_ms = 1000;
  auto ack = ask<proto::msg::HelloAck>(*link, d, hello);
  if (!ack || ack->magic != proto::kMagic || ack->version != proto::kVersion) {
    r.stage = "agent";
    r.problem = ack ? "the agent speaks protocol version " + std::to_string(ack->version) +
                          ", this mltrain " + std::to_string(proto::kVersion)
                    : "the agent did not answer";
    return r;
  }
  // A ping first: its round trip bounds how stale the host's clock reading is.
  auto p0 = Clock::now();
  if (!ask<proto::msg::Pong>(*link, d, proto::msg::Ping{})) {
    r.stage = "agent";
    r.problem = "the agent did not answer a ping";
    return r;
  }
  double rtt = std::chrono::duration<double, std::milli>(Clock::now() - p0).count();
  int64_t w0 = wall_ms();
  auto probed = ask<proto::msg::Probed>(*link, d, proto::msg::Probe{uint32_t(port)});
  if (!probed) {
    r.stage = "agent";
    r.problem = "the agent did not answer the probe";
    return r;
  }
  for (const auto& kv : probed->facts) {
    auto eq = kv.find('=');
    if (eq != std::string::npos) r.facts[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  // The host read its clock first thing, about half a round trip after we sent the probe.
  if (r.facts.count("time_ms"))
    r.clock_offset_ms = double(std::stoll(r.facts["time_ms"])) - (double(w0) + rtt / 2);
  r.facts.erase("time_ms");
  r.rtt_ms = rtt;
  ask<proto::msg::Bye>(*link, d, proto::msg::Shutdown{});
  r.ok = true;
  if (r.facts.count("port_free") && r.facts["port_free"] == "no") {
    r.ok = false;
    r.stage = "port";
    r.problem = "master port " + std::to_string(port) + " is in use";
  }
  return r;
}

std::string fact(const HostReport& r, const char* k) {
  auto it = r.facts.find(k);
  return it == r.facts.end() ? "-" : it->second;
}

}  // namespace

std::vector<HostReport> run_doctor(const std::vector<plan::HostPlan>& hosts, const TransportFor& tf,
                                   int master_port) {
  std::vector<HostReport> reports(hosts.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < hosts.size(); ++i)
    threads.emplace_back([&, i] { reports[i] = check_host(hosts[i], tf, i == 0 ? master_port : 0); });
  for (auto& t : threads) t.join();
  return reports;
}

std::string format_doctor(const std::vector<HostReport>& reports, bool json) {
  if (json) {
    nlohmann::ordered_json a = nlohmann::ordered_json::array();
    for (const auto& r : reports)
      a.push_back({{"host", r.host},
                   {"ok", r.ok},
                   {"stage", r.stage},
                   {"problem", r.problem},
                   {"facts", r.facts},
                   {"clock_offset_ms", r.clock_offset_ms},
                   {"rtt_ms", r.rtt_ms}});
    return a.dump(2) + "\n";
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
  return out;
}

}  // namespace mltrain::supervise
