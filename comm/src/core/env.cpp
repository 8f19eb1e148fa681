#include "core/env.h"

#include <cstdlib>
#include <unistd.h>

#include "mltrain/comm.hpp"

namespace mltrain::comm::detail {

namespace {
const Knob kKnobs[] = {
    {"RANK", "0", "this process's rank"},
    {"WORLD_SIZE", "1", "number of ranks"},
    {"MLTRAIN_STORE_ADDR", "$MASTER_ADDR:$MASTER_PORT+1", "host:port of the store rank 0 hosts"},
    {"MLTRAIN_TOKEN", "(empty)", "job secret every store connection must prove"},
    {"MLTRAIN_COMM_TIMEOUT", "300", "seconds any call may block before it fails naming the peer"},
    {"MLTRAIN_COMM_TRANSPORT", "auto", "auto (shm on one host, TCP across), tcp, or shm"},
    {"MLTRAIN_COMM_SHM_BYTES", "1M", "shared-memory ring capacity per direction per pair"},
    {"MLTRAIN_COMM_CHUNK_BYTES", "256K", "pipeline piece (TCP links: twice that, at least 512K)"},
    {"MLTRAIN_COMM_SMALL_BYTES", "64K", "at or below: recursive doubling (power-of-two worlds)"},
    {"MLTRAIN_COMM_SPIN_US", "50", "microseconds to spin (yielding) before blocking"},
    {"MLTRAIN_COMM_ALGO", "auto", "large allreduce, 3+ ranks: ring, bidir, hd, or auto (ring on one host; across hosts hd on power-of-two worlds, else bidir)"},
    {"MLTRAIN_COMM_HOST", "gethostname()", "host identity; equal identities use shared memory"},
};
}  // namespace

const Knob* knobs(std::size_t* count) {
  *count = sizeof(kKnobs) / sizeof(kKnobs[0]);
  return kKnobs;
}

std::string env_string(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return fallback;
  return value;
}

std::uint64_t parse_size(const std::string& text, const char* what) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str())
    throw Error(Error::Kind::usage, std::string(what) + ": not a size: '" + text + "'");
  std::uint64_t scale = 1;
  const std::string suffix(end);
  if (suffix == "K" || suffix == "k" || suffix == "KiB") scale = 1ull << 10;
  else if (suffix == "M" || suffix == "m" || suffix == "MiB") scale = 1ull << 20;
  else if (suffix == "G" || suffix == "g" || suffix == "GiB") scale = 1ull << 30;
  else if (!suffix.empty())
    throw Error(Error::Kind::usage, std::string(what) + ": unknown size suffix in '" + text +
                                        "' (use K, M or G)");
  return value * scale;
}

std::int64_t env_int(const char* name, std::int64_t fallback) {
  const std::string text = env_string(name);
  if (text.empty()) return fallback;
  char* end = nullptr;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0')
    throw Error(Error::Kind::usage, std::string(name) + "='" + text + "' is not an integer");
  return value;
}

}  // namespace mltrain::comm::detail

namespace mltrain::comm {

Options Options::from_env() {
  using namespace detail;
  Options o;
  o.rank = static_cast<int>(env_int("RANK", 0));
  o.world_size = static_cast<int>(env_int("WORLD_SIZE", 1));
  o.store_addr = env_string("MLTRAIN_STORE_ADDR");
  if (o.store_addr.empty()) {
    const std::string master = env_string("MASTER_ADDR", "127.0.0.1");
    const std::int64_t port = env_int("MASTER_PORT", 29500);
    o.store_addr = master + ":" + std::to_string(port + 1);
  }
  o.token = env_string("MLTRAIN_TOKEN");
  const std::string timeout = env_string("MLTRAIN_COMM_TIMEOUT", "300");
  char* end = nullptr;
  const double seconds = std::strtod(timeout.c_str(), &end);
  if (end == timeout.c_str() || seconds <= 0)
    throw Error(Error::Kind::usage, "MLTRAIN_COMM_TIMEOUT='" + timeout + "' is not a positive "
                                    "number of seconds");
  o.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(seconds * 1000));
  const std::string transport = env_string("MLTRAIN_COMM_TRANSPORT", "auto");
  if (transport == "auto") o.transport = Transport::automatic;
  else if (transport == "tcp") o.transport = Transport::tcp;
  else if (transport == "shm") o.transport = Transport::shm;
  else
    throw Error(Error::Kind::usage,
                "MLTRAIN_COMM_TRANSPORT='" + transport + "' (expected auto, tcp or shm)");
  o.shm_bytes = parse_size(env_string("MLTRAIN_COMM_SHM_BYTES", "1M"), "MLTRAIN_COMM_SHM_BYTES");
  o.chunk_bytes =
      parse_size(env_string("MLTRAIN_COMM_CHUNK_BYTES", "256K"), "MLTRAIN_COMM_CHUNK_BYTES");
  o.small_bytes =
      parse_size(env_string("MLTRAIN_COMM_SMALL_BYTES", "64K"), "MLTRAIN_COMM_SMALL_BYTES");
  o.spin_us = static_cast<int>(env_int("MLTRAIN_COMM_SPIN_US", 50));
  const std::string algo = env_string("MLTRAIN_COMM_ALGO", "auto");
  if (algo == "auto") o.algo = Algo::automatic;
  else if (algo == "ring") o.algo = Algo::ring;
  else if (algo == "bidir") o.algo = Algo::bidir;
  else if (algo == "hd") o.algo = Algo::hd;
  else
    throw Error(Error::Kind::usage,
                "MLTRAIN_COMM_ALGO='" + algo + "' (expected auto, ring, bidir or hd)");
  o.host = env_string("MLTRAIN_COMM_HOST");
  return o;
}

}  // namespace mltrain::comm
