#include "rendezvous/blame.h"

#include <algorithm>
#include <charconv>
#include <thread>

namespace mltrain::comm::detail {

Blame::Blame(StoreClient* store, int rank, std::vector<std::string> hosts, std::chrono::milliseconds timeout)
    : store_(store), rank_(rank), hosts_(std::move(hosts)), timeout_(timeout) {}

std::string Blame::label(int rank) const {
  return "rank " + std::to_string(rank) + " (" + hosts_[static_cast<std::size_t>(rank)] + ")";
}

std::optional<AbortRecord> Blame::read_abort(Deadline dl) const {
  const auto value = store_->get("abort", dl);
  return value ? AbortRecord::decode(*value) : std::nullopt;
}

std::optional<AbortRecord> Blame::poll_abort(Clock::time_point until, std::chrono::milliseconds step,
                                             Deadline dl) const {
  while (Clock::now() < until) {
    if (auto found = read_abort(dl)) return found;
    std::this_thread::sleep_for(step);
  }
  return std::nullopt;
}

void Blame::follow_wait_chain(int waited_on, Verdict& v, Deadline dl) const {
  const int world = static_cast<int>(hosts_.size());
  std::vector<bool> seen(hosts_.size(), false);
  seen[static_cast<std::size_t>(rank_)] = true;
  int at = waited_on;
  std::string chain;
  bool cycle = false;
  while (true) {
    seen[static_cast<std::size_t>(at)] = true;
    const auto next = store_->get("waiting/" + std::to_string(at), dl);
    if (!next) break;
    chain += ", which waits on rank " + *next;
    int to = -1;
    std::from_chars(next->data(), next->data() + next->size(), to);
    if (to < 0 || to >= world || seen[static_cast<std::size_t>(to)]) {
      cycle = true;  // ranks wait on each other: nobody in particular stopped
      break;
    }
    at = to;
  }
  if (cycle) {
    v.detail += "; rank " + std::to_string(waited_on) + chain + " (a cycle: the ranks wait on each other)";
  } else if (at != waited_on) {
    v.culprit = at;
    v.culprit_host = hosts_[static_cast<std::size_t>(at)];
    v.detail +=
        "; rank " + std::to_string(waited_on) + chain + " (" + label(at) + " stopped making progress)";
  }
}

std::optional<AbortRecord> Blame::claim_first(const Verdict& v, const std::string& what, Deadline dl) const {
  if (store_->add("abort/claims", 1, dl) == 1) {
    AbortRecord mine;
    mine.culprit = v.culprit;
    mine.culprit_host = v.culprit_host;
    mine.reporter = rank_;
    mine.message = label(rank_) + ": " + what + ": " + v.detail;
    store_->set("abort", mine.encode(), dl);
    return std::nullopt;
  }
  // Another rank claimed it: its record follows within moments.
  return poll_abort(Clock::now() + std::chrono::seconds(1), std::chrono::milliseconds(10), dl);
}

Verdict Blame::settle(const Error& e, const std::string& what) const {
  Verdict v;
  const bool usage = e.kind() == Error::Kind::usage;
  v.culprit = usage ? rank_ : e.peer_rank();
  v.culprit_host = usage ? hosts_[static_cast<std::size_t>(rank_)] : e.peer_host();
  v.detail = e.what();
  if (store_ == nullptr) return v;
  const Deadline dl = Clock::now() + std::min<std::chrono::milliseconds>(timeout_, std::chrono::seconds(2));
  const auto grace_end = [&] {
    return Clock::now() + std::min<std::chrono::milliseconds>(timeout_ / 2, std::chrono::seconds(1));
  };
  try {
    std::optional<AbortRecord> found;
    if (e.kind() == Error::Kind::timeout && e.peer_rank() >= 0) {
      // The peer we waited on may itself be waiting on another rank: give the others a moment to
      // record theirs too before following the chain.
      store_->set("waiting/" + std::to_string(rank_), std::to_string(e.peer_rank()), dl);
      found = poll_abort(grace_end(), std::chrono::milliseconds(20), dl);
      if (!found) follow_wait_chain(e.peer_rank(), v, dl);
    }
    // A remote failure with no rank named (NCCL's ncclRemoteError): the rank that failed is about
    // to publish why; give it a moment rather than claim the first failure ourselves.
    if (!found && e.kind() == Error::Kind::peer_closed && e.peer_rank() < 0)
      found = poll_abort(grace_end(), std::chrono::milliseconds(10), dl);
    if (!found) found = read_abort(dl);
    if (!found) found = claim_first(v, what, dl);
    if (found && found->reporter != rank_) {
      v.culprit = found->culprit;
      v.culprit_host = found->culprit_host;
      v.first = found->message;
      // The rank at fault is exiting now: let it go first, so the launcher names it as the first
      // failure rather than this rank, which only saw its effect.
      if (v.culprit >= 0 && v.culprit != rank_)
        std::this_thread::sleep_for(
            std::min<std::chrono::milliseconds>(timeout_ / 4, std::chrono::milliseconds(300)));
    }
  } catch (const Error&) {
    // Store unreachable (rank 0 gone?): the local error is all we can report.
  }
  return v;
}

}  // namespace mltrain::comm::detail
