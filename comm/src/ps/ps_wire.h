// The parameter-server wire format: one header struct per frame, each with its one encoder and
// decoder. Integers travel in host byte order (every host of a job runs the same architecture).
//
//   worker hello   Hello, then the token
//   server reply   HelloReply, then the message (empty when status is ok)
//   request        Request, then count elements of dtype (declare: the initial value; push and
//                  push_pull: the values pushed; pull: nothing)
//   reply          Reply, then len bytes: the part's values (pull, push_pull), or the error
//                  message when status is not ok; declare and push answer with len 0
// Replies carry the request's id and may come out of order (a sync pull waits for its round).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>

#include "core/wire.h"

namespace mltrain::comm::detail::pswire {

inline constexpr std::uint32_t kMagic = 0x53504c4d;  // "MLPS"
inline constexpr std::uint16_t kVersion = 1;
inline constexpr std::uint32_t kMaxToken = 4096;
inline constexpr std::uint64_t kMaxPartBytes = 1ull << 30;

enum Op : std::uint8_t { kDeclare = 1, kPush = 2, kPull = 3, kPushPull = 4 };
enum Status : std::uint16_t {
  kOk = 0,
  kBadToken = 1,
  kBadVersion = 2,
  kBadHello = 3,    // a worker id out of range, or already connected
  kUnknownKey = 4,  // not declared on this server
  kMismatch = 5,    // another count or dtype than the declaration
  kBadRequest = 6,  // an op or dtype this server does not know
  kStale = 7,       // the hello's generation is older than the server's
  kNoMemory = 8,    // holding it would pass the server's memory budget (ServerConfig::memory_budget)
};

using wire::get;  // comm's field encoders (host byte order)
using wire::put;

struct Hello {
  static constexpr std::size_t kSize = 24;
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::int32_t worker = -1;
  std::int32_t num_workers = 0;
  std::uint32_t generation = 0;
  std::uint32_t token_len = 0;
  void put_to(std::string& out) const {
    put(out, magic), put(out, version), put(out, std::uint16_t(0)), put(out, worker), put(out, num_workers);
    put(out, generation), put(out, token_len);
  }
  static Hello from(const char* p) {
    return {get<std::uint32_t>(p),     get<std::uint16_t>(p + 4),  get<std::int32_t>(p + 8),
            get<std::int32_t>(p + 12), get<std::uint32_t>(p + 16), get<std::uint32_t>(p + 20)};
  }
};

struct HelloReply {
  static constexpr std::size_t kSize = 16;
  std::uint32_t magic = kMagic;
  std::uint16_t version = kVersion;
  std::uint16_t status = kOk;
  std::int32_t server = -1;  // the server's index in the job
  std::uint32_t message_len = 0;
  void put_to(std::string& out) const {
    put(out, magic), put(out, version), put(out, status), put(out, server), put(out, message_len);
  }
  static HelloReply from(const char* p) {
    return {get<std::uint32_t>(p), get<std::uint16_t>(p + 4), get<std::uint16_t>(p + 6),
            get<std::int32_t>(p + 8), get<std::uint32_t>(p + 12)};
  }
};

struct Request {
  static constexpr std::size_t kSize = 32;
  std::uint8_t op = 0;
  std::uint8_t dtype = 0;
  std::uint32_t id = 0;
  std::uint64_t key = 0;
  std::uint32_t part = 0;
  std::uint64_t count = 0;  // elements in this part
  void put_to(std::string& out) const {
    put(out, op), put(out, dtype), put(out, std::uint16_t(0)), put(out, id), put(out, key), put(out, part);
    put(out, std::uint32_t(0)), put(out, count);
  }
  void put_to(char* p) const {
    std::string s;
    put_to(s);
    std::memcpy(p, s.data(), kSize);
  }
  static Request from(const char* p) {
    return {std::uint8_t(p[0]),        std::uint8_t(p[1]),         get<std::uint32_t>(p + 4),
            get<std::uint64_t>(p + 8), get<std::uint32_t>(p + 16), get<std::uint64_t>(p + 24)};
  }
};

struct Reply {
  static constexpr std::size_t kSize = 16;
  std::uint32_t id = 0;
  std::uint16_t status = kOk;
  std::uint64_t len = 0;
  void put_to(std::string& out) const {
    put(out, id), put(out, status), put(out, std::uint16_t(0)), put(out, len);
  }
  static Reply from(const char* p) {
    return {get<std::uint32_t>(p), get<std::uint16_t>(p + 4), get<std::uint64_t>(p + 8)};
  }
};

}  // namespace mltrain::comm::detail::pswire
