#include "rendezvous/join.h"

#include <cctype>
#include <cstdio>
#include <random>

namespace mltrain::comm::detail {

namespace {

std::string hex64(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

}  // namespace

std::string shm_safe(const std::string& run_id) {
  std::string run;
  for (char c : run_id.substr(0, 100))
    run += std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.' ? c : '_';
  return run;
}

JobSession agree_session(StoreClient& store, int rank, const std::string& run_id, Deadline deadline) {
  JobSession s;
  if (rank == 0) {
    std::random_device rd;
    s.id = (static_cast<std::uint64_t>(rd()) << 32) ^ rd() ^
           static_cast<std::uint64_t>(Clock::now().time_since_epoch().count());
    // Shared memory names carry the run id when there is one (rank 0's, so all agree).
    const std::string run = shm_safe(run_id);
    s.shm_base = "/mltrain-" + (run.empty() ? "" : run + "-") + hex64(s.id);
    store.set("shm_base", s.shm_base, deadline);
    store.set("session", hex64(s.id), deadline);
  } else {
    s.id = std::stoull(store.wait("session", deadline), nullptr, 16);
    s.shm_base = store.wait("shm_base", deadline);
  }
  return s;
}

std::vector<PeerRecord> exchange_records(StoreClient& store, int rank, int world, const PeerRecord& mine,
                                         Deadline deadline, std::chrono::milliseconds timeout,
                                         const std::string& me) {
  store.set("rank/" + std::to_string(rank), mine.encode(), deadline);
  std::vector<PeerRecord> peers(static_cast<std::size_t>(world));
  peers[static_cast<std::size_t>(rank)] = mine;
  for (int p = 0; p < world; ++p) {
    if (p == rank) continue;
    std::string value;
    try {
      value = store.wait("rank/" + std::to_string(p), deadline);
    } catch (const Error& e) {
      if (e.kind() != Error::Kind::timeout) throw;
      throw Error(Error::Kind::timeout,
                  "mltrain-comm: " + me + ": rank " + std::to_string(p) +
                      " did not join through the store at " + store.addr() + " within " +
                      std::to_string(timeout.count() / 1000) + " s (is it running?)",
                  p);
    }
    auto record = PeerRecord::decode(value);
    if (!record) throw Error(Error::Kind::store, "bad rank record for rank " + std::to_string(p));
    peers[static_cast<std::size_t>(p)] = std::move(*record);
  }
  return peers;
}

}  // namespace mltrain::comm::detail
