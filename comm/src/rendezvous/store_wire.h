// The store's wire format: one header struct per frame, each with its one encoder and decoder.
// Integers travel in host byte order (every rank of a job runs the same architecture).
//
//   client hello   Hello, then the token
//   server reply   HelloReply, then the message (empty when status is ok)
//   request        Request, then the key; set: u32 value length and the value; add: i64 delta
//   get/wait reply ValueReply, then the value; set reply: one byte; add reply: the i64 sum
#pragma once

#include <cstdint>
#include <string>

#include "core/wire.h"

namespace mltrain::comm::detail::wire {

inline constexpr std::uint32_t kStoreMagic = 0x4d4c5354;  // "MLST"
inline constexpr std::uint16_t kStoreVersion = 1;
inline constexpr std::uint32_t kMaxToken = 4096;

enum Op : std::uint8_t { kSet = 1, kGet = 2, kWait = 3, kAdd = 4 };
enum Status : std::uint16_t { kOk = 0, kBadToken = 1, kBadVersion = 2 };

struct Hello {
  static constexpr std::size_t kSize = 16;
  std::uint32_t magic = kStoreMagic;
  std::uint16_t version = kStoreVersion;
  std::int32_t rank = -1;
  std::uint32_t token_len = 0;
  void put_to(std::string& out) const {
    put(out, magic), put(out, version), put(out, std::uint16_t(0)), put(out, rank), put(out, token_len);
  }
  static Hello from(const char* p) {
    return {get<std::uint32_t>(p), get<std::uint16_t>(p + 4), get<std::int32_t>(p + 8),
            get<std::uint32_t>(p + 12)};
  }
};

struct HelloReply {
  static constexpr std::size_t kSize = 12;
  std::uint32_t magic = kStoreMagic;
  std::uint16_t version = kStoreVersion;
  std::uint16_t status = kOk;
  std::uint32_t message_len = 0;
  void put_to(std::string& out) const {
    put(out, magic), put(out, version), put(out, status), put(out, message_len);
  }
  static HelloReply from(const char* p) {
    return {get<std::uint32_t>(p), get<std::uint16_t>(p + 4), get<std::uint16_t>(p + 6),
            get<std::uint32_t>(p + 8)};
  }
};

struct Request {
  static constexpr std::size_t kSize = 5;
  std::uint8_t op = 0;
  std::uint32_t key_len = 0;
  void put_to(std::string& out) const { put(out, op), put(out, key_len); }
  static Request from(const char* p) { return {std::uint8_t(p[0]), get<std::uint32_t>(p + 1)}; }
};

struct ValueReply {
  static constexpr std::size_t kSize = 5;
  std::uint8_t found = 0;
  std::uint32_t value_len = 0;
  void put_to(std::string& out) const { put(out, found), put(out, value_len); }
  static ValueReply from(const char* p) { return {std::uint8_t(p[0]), get<std::uint32_t>(p + 1)}; }
};

}  // namespace mltrain::comm::detail::wire
