// What both sides of a sync need to agree on: a file's content hash (XXH3-128, its 16 canonical
// bytes), how hashes are written as text, and file times as nanoseconds. Header-only and libc only:
// the launcher and the agent both use it.
#pragma once

#include <sys/stat.h>
#include <time.h>

#include <cstdint>
#include <string>
#include <string_view>

#define XXH_INLINE_ALL
#include <xxhash.h>

namespace mltrain::sync {

// The 16 bytes of a hash in XXH3's canonical (big-endian) order.
inline std::string canonical(const XXH128_hash_t& h) {
  XXH128_canonical_t c;
  XXH128_canonicalFromHash(&c, h);
  return std::string(reinterpret_cast<const char*>(c.digest), sizeof c.digest);
}

inline std::string hex(std::string_view bytes) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (unsigned char c : bytes) {
    s += d[c >> 4];
    s += d[c & 15];
  }
  return s;
}

inline int64_t mtime_ns(const struct stat& st) {
  return int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

inline timespec to_timespec(int64_t ns) {
  timespec t{};
  t.tv_sec = time_t(ns / 1'000'000'000);
  t.tv_nsec = long(ns % 1'000'000'000);
  return t;
}

}  // namespace mltrain::sync
