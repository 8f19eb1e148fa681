#include "core/env.h"

#include "knobs/parse.h"
#include "knobs/registry.h"
#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

std::uint64_t parse_size(const std::string& text, const char* what) {
  if (auto bytes = knobs::parse_bytes(text)) return *bytes;
  throw Error(Error::Kind::usage,
              std::string(what) + ": '" + text + "' is not a size (write it like 4096, 64K, 1M, 2G)");
}

int local_rank() {
  try {
    return static_cast<int>(knobs::get_int("LOCAL_RANK"));
  } catch (const knobs::BadValue& e) {
    throw Error(Error::Kind::usage, e.what());
  }
}

}  // namespace mltrain::comm::detail

namespace mltrain::comm {

namespace {

// Every knob read goes through the registry; its parse errors become the library's usage error.
Options read_options() {
  Options o;
  o.rank = static_cast<int>(knobs::get_int("RANK"));
  o.world_size = static_cast<int>(knobs::get_int("WORLD_SIZE"));
  o.store_addr = knobs::get_string("MLTRAIN_STORE_ADDR");
  if (o.store_addr.empty())
    o.store_addr = knobs::get_string("MASTER_ADDR") + ":" + std::to_string(knobs::get_int("MASTER_PORT") + 1);
  o.token = knobs::get_string("MLTRAIN_TOKEN");
  o.timeout = knobs::get_duration("MLTRAIN_COMM_TIMEOUT");
  if (o.timeout.count() <= 0)
    throw knobs::BadValue("MLTRAIN_COMM_TIMEOUT='" + knobs::get_string("MLTRAIN_COMM_TIMEOUT") +
                          "' must be more than 0 (write it like 90s, 5m, 1h30m)");
  const std::string transport = knobs::get_choice("MLTRAIN_COMM_TRANSPORT");
  o.transport = transport == "tcp"   ? Transport::tcp
                : transport == "shm" ? Transport::shm
                                     : Transport::automatic;
  o.shm_bytes = knobs::get_bytes("MLTRAIN_COMM_SHM_BYTES");
  o.chunk_bytes = knobs::get_bytes("MLTRAIN_COMM_CHUNK_BYTES");
  o.small_bytes = knobs::get_bytes("MLTRAIN_COMM_SMALL_BYTES");
  o.spin_us = static_cast<int>(knobs::get_int("MLTRAIN_COMM_SPIN_US"));
  o.tcp_congestion = knobs::get_string("MLTRAIN_COMM_TCP_CC");
  const std::string algo = knobs::get_choice("MLTRAIN_COMM_ALGO");
  o.algo = algo == "ring"     ? Algo::ring
           : algo == "bidir"  ? Algo::bidir
           : algo == "hd"     ? Algo::hd
           : algo == "direct" ? Algo::direct
                              : Algo::automatic;
  const std::string backend = knobs::get_choice("MLTRAIN_COMM_BACKEND");
  o.backend = backend == "tcp" ? Backend::tcp : backend == "nccl" ? Backend::nccl : Backend::automatic;
  o.host = knobs::get_string("MLTRAIN_COMM_HOST");
  o.host_splits_shm = !o.host.empty();
  o.debug_links = knobs::get_flag("MLTRAIN_COMM_DEBUG");
  o.stats = knobs::get_flag("MLTRAIN_COMM_STATS");
  o.stats_name = knobs::get_string("MLTRAIN_COMM_STATS_NAME");
  o.run_id = knobs::get_string("MLTRAIN_RUN_ID");
  return o;
}

}  // namespace

Options Options::from_env() {
  try {
    return read_options();
  } catch (const knobs::BadValue& e) {
    throw Error(Error::Kind::usage, e.what());
  }
}

}  // namespace mltrain::comm
