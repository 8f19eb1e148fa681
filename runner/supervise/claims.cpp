// The run's claims (docs/sharing.md): once preflight passed on every host, each host's agent is
// asked for the job's GPUs (and the host alone, when exclusive); every host grants, or the job
// gives back what was granted and either waits its turn in the hosts' queue (--queue) or fails at
// once naming who holds what. A job waiting holds only its place, so two jobs can never each hold
// what the other waits for.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"
#include "runner/lease/lease.h"
#include "runner/supervise/detail/run_play.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;
using std::chrono::milliseconds;

namespace {

// A field of what a holder said: another user's words, so escaped and cut.
std::string said(const lease::Info& info, const char* key, size_t max = 64) {
  auto it = info.find(key);
  return it == info.end() ? std::string() : text::host_text(it->second, max);
}

// "run 20261203-101500-bert (alice@laptop) for 1h02m", or the kernel's word when it did not say.
std::string holder_text(const lease::Info& info) {
  const std::string run = said(info, "run", 80), user = said(info, "user"), where = said(info, "launcher");
  if (run.empty()) {
    const std::string uid = said(info, "uid", 12), pid = said(info, "pid", 12);
    return uid.empty() ? std::string("a job that did not say which")
                       : "a job of uid " + uid + " (pid " + pid + ")";
  }
  std::string out = "run " + run;
  // Who launched it, and the account it runs as on the host when that is another name.
  const std::string account = said(info, "account", 40);
  if (!user.empty())
    out += " (" + user + (where.empty() ? "" : "@" + where) +
           (account.empty() || account == user ? "" : " as " + account) + ")";
  if (auto since = text::parse_int_in(said(info, "since", 20), 1, INT64_MAX)) {
    const int64_t now = int64_t(std::time(nullptr));
    if (now >= *since) out += " for " + text::format_duration(milliseconds((now - *since) * 1000));
  }
  return out;
}

}  // namespace

void RunPlay::send_claims() {
  if (!opts_.claims) return start_job();
  const ClaimJob& c = *opts_.claims;
  for (size_t i = 0; i < fleet_.size(); ++i) {
    hosts_[i].claimed.reset();
    if (!fleet_[i].open()) continue;
    const plan::HostPlan& hp = *fleet_[i].plan;
    msg::Claim m;
    m.run_id = plan_.run_id;
    m.order_key = c.queue ? c.order_key : std::string();
    m.lease_space = c.space;
    m.gpus = uint32_t(std::max(hp.gpu_slots_needed, 0));
    if (hp.gpu_slots_needed > 0) m.pinned_gpus.assign(hp.gpu_ids.begin(), hp.gpu_ids.end());
    m.exclusive = c.exclusive ? 1 : 0;
    m.claim_info = c.info;
    m.claim_info.push_back("gpus=" + std::to_string(m.gpus));
    fleet_.send(i, m);
  }
}

// "h1: ignoring the lease exclusive, held by uid 1001 (bob) as pid 4242: it is not an mltrain agent
// (its process is 'python3')": once per host and name for the run, however often it claims.
void RunPlay::name_squatters(size_t i, const std::vector<std::string>& squatters) {
  auto& named = hosts_[i].squatters_named;
  for (size_t k = 0; k < squatters.size() && k < 16 && named.size() < 64; ++k) {
    lease::Info info = lease::decode(squatters[k]);
    const std::string name = said(info, "name", lease::kMaxName);
    if (name.empty() || std::count(named.begin(), named.end(), name)) continue;
    named.push_back(name);
    const std::string uid = said(info, "uid", 12), account = said(info, "account", 40);
    out_->before_message();
    std::fprintf(stderr, "mltrain: %s: ignoring the lease %s, held by uid %s%s, pid %s: %s\n",
                 fleet_[i].name().c_str(), name.c_str(), uid.empty() ? "?" : uid.c_str(),
                 account.empty() ? "" : (" (" + account + ")").c_str(), said(info, "pid", 12).c_str(),
                 said(info, "doubt", 200).c_str());
  }
}

void RunPlay::on(size_t i, uint32_t, msg::Claimed& m) {
  if (phase_ != Phase::claiming || hosts_[i].claimed) return;
  name_squatters(i, m.squatters);
  m.squatters.clear();
  if (m.in_the_way.size() > 64) m.in_the_way.resize(64);  // a host's word: bounded
  hosts_[i].claimed = std::move(m);
  on_progress();  // every host answered: claims_answered()
}

// "h2: GPUs 0-3 held by run 20261203-101500-bert (alice@laptop) for 1h02m; GPU 5 runs a process that
// is not mltrain's" — one line per host, from what its agent said.
std::string RunPlay::claim_obstacles(size_t i) const {
  const msg::Claimed& c = *hosts_[i].claimed;
  if (c.state == uint32_t(msg::ClaimState::failed))
    return fleet_[i].name() + ": cannot claim the host: " + text::host_text(c.error, 400);
  std::map<std::string, std::vector<int>> gpus_by_holder;  // holder text -> GPU indices
  std::vector<std::string> parts;
  for (const auto& entry : c.in_the_way) {
    lease::Info info = lease::decode(entry);
    const std::string what = said(info, "what", 40);
    if (what.rfind("gpu ", 0) == 0) {
      if (auto g = text::parse_int_in(what.substr(4), 0, 1 << 16))
        gpus_by_holder[holder_text(info)].push_back(int(*g));
    } else if (what.rfind("foreign process on gpu ", 0) == 0) {
      parts.push_back("GPU " + what.substr(23) + " runs a process that is not mltrain's");
    } else if (what == "queue") {
      parts.push_back(std::to_string(c.ahead) + (c.ahead == 1 ? " job" : " jobs") +
                      " waiting ahead, the first " + holder_text(info));
    } else if (what == "exclusive") {
      parts.push_back("held alone by " + holder_text(info));
    } else if (what == "job") {
      parts.push_back(holder_text(info) + " runs there");
    }
  }
  for (const auto& [who, gpus] : gpus_by_holder)
    parts.push_back((gpus.size() == 1 ? "GPU " : "GPUs ") + text::int_ranges(gpus) + " held by " + who);
  if (parts.empty()) parts.push_back("busy");
  return fleet_[i].name() + ": " + text::join(parts, "; ");
}

void RunPlay::claims_answered() {
  if (auto lines = failed_hosts(); !lines.empty()) return preflight_failed(lines);  // lost meanwhile
  std::vector<size_t> granted, busy, failed;
  for (size_t i = 0; i < fleet_.size(); ++i) {
    if (!hosts_[i].claimed) continue;  // lost meanwhile: on_lost ends the run
    const uint32_t st = hosts_[i].claimed->state;
    if (plan_.hosts[i].spare && st != uint32_t(msg::ClaimState::granted)) {
      leave_out_spare(i);
      continue;
    }
    (st == uint32_t(msg::ClaimState::granted) ? granted
     : st == uint32_t(msg::ClaimState::busy)  ? busy
                                              : failed)
        .push_back(i);
  }
  if (busy.empty() && failed.empty()) {
    out_->set_status("");
    return start_job();
  }
  // Nothing is held while waiting but the place in the queue: no job holds what another waits for.
  for (size_t i : granted) fleet_.send(i, msg::Unclaim{});
  if (!failed.empty() || !opts_.claims->queue) {
    std::vector<std::string> lines;
    for (size_t i : failed) lines.push_back("  " + claim_obstacles(i));
    for (size_t i : busy) lines.push_back("  " + claim_obstacles(i));
    preflight_error_ = (failed.empty() ? "what the job needs is held by other jobs; no rank was started:\n"
                                       : "the job could not claim its hosts; no rank was started:\n") +
                       text::join(lines, "\n");
    ending_ = failed.empty() ? Ending::busy : Ending::preflight_failed;
    if (!failed.empty())
      for (size_t i : failed) fleet_.fail(i, claim_obstacles(i));
    return step(Event::refused);
  }
  const std::string status = waiting_status();
  if (out_->terminal()) {
    out_->set_status("mltrain: " + status);
  } else if (status != waiting_said_) {  // a log or a CI job: a line when it changes
    out_->before_message();
    std::fprintf(stderr, "mltrain: %s\n", status.c_str());
  }
  waiting_said_ = status;
  step(Event::busy);
}

// A spare the job cannot have now (another job holds what it would need there, or the claim failed)
// is left out, as one that failed preflight: the job starts without it rather than wait for a host
// it may never use. Its link goes, so its agent leaves the host's queue and holds nothing there.
void RunPlay::leave_out_spare(size_t i) {
  const std::string why = claim_obstacles(i);
  const std::string& n = fleet_[i].name();
  out_->before_message();
  std::fprintf(stderr, "mltrain: spare %s is left out: %s\n", n.c_str(), why.substr(n.size() + 2).c_str());
  fleet_.fail(i, why);
  fleet_[i].link->kill();
}

// "waiting for 2 GPUs on h2; 1 job ahead": what the first busy host lacks, and the longest line.
std::string RunPlay::waiting_status(bool interactive) const {
  std::vector<std::string> hosts;
  uint32_t ahead = 0, gpus = 0;
  for (size_t i = 0; i < fleet_.size(); ++i) {
    const auto& c = hosts_[i].claimed;
    if (!c || c->state != uint32_t(msg::ClaimState::busy)) continue;
    hosts.push_back(fleet_[i].name());
    ahead = std::max(ahead, c->ahead);
    gpus = std::max(gpus, uint32_t(std::max(fleet_[i].plan->gpu_slots_needed, 0)));
  }
  std::string what = gpus > 0 ? std::to_string(gpus) + (gpus == 1 ? " GPU" : " GPUs") + " on "
                              : std::string(opts_.claims && opts_.claims->exclusive ? "the whole host " : "");
  std::string s = "waiting for " + what + text::compact_names(hosts);
  if (ahead > 0) s += "; " + std::to_string(ahead) + (ahead == 1 ? " job" : " jobs") + " ahead";
  return interactive ? s + " (Ctrl-C leaves the queue)" : s;
}

void RunPlay::claim_timers(Clock::time_point now) {
  fleet_.heartbeats(now);
  if (phase_ == Phase::queued && queue_deadline_ && now >= *queue_deadline_) {
    // Nothing is held while waiting but the place, which goes with the agents: nothing to give back.
    std::vector<std::string> lines;
    for (size_t i = 0; i < fleet_.size(); ++i)
      if (hosts_[i].claimed && hosts_[i].claimed->state == uint32_t(msg::ClaimState::busy))
        lines.push_back("  " + claim_obstacles(i));
    out_->set_status("");
    preflight_error_ =
        "the job waited in the queue for " + text::format_duration(opts_.claims->queue_timeout) +
        " ([cluster] queue_timeout) and left it; no rank was started:\n" + text::join(lines, "\n");
    ending_ = Ending::busy;
    return step(Event::refused);
  }
  if (phase_ == Phase::queued && retry_at_ && now >= *retry_at_) {
    retry_at_.reset();
    step(Event::retry);
  }
}

void RunPlay::finish_busy() {
  record_unstarted("busy", exit_code::busy, "busy");
  throw Error(preflight_error_,
              queue_deadline_
                  ? "wait longer with a larger --queue-timeout (or none); `mltrain queue` shows "
                    "who holds what and who waits ahead"
                  : "wait for them with --queue ([cluster] queue = true); `mltrain queue` shows who "
                    "holds what",
              exit_code::busy);
}

}  // namespace mltrain::supervise::detail
