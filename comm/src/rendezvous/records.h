// The records ranks publish in the store, each a struct with one versioned, bounded codec:
//   rank/<r>  PeerRecord   who rank r is and how to reach it (written once, at init)
//   abort     AbortRecord  the job's first failure (written once, by the rank that claims it)
// A value that is short, too long, of another version or with bytes left over decodes to nothing.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "transport/nccl.h"

namespace mltrain::comm::detail {

struct PeerRecord {
  static constexpr std::uint32_t kMagic = 0x52504c4d;  // "MLPR"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kMaxField = 4096;  // each string (a host name, a reason)

  std::string host;    // identity, also shown in messages
  std::string ip;      // the address peers on other hosts reach
  int port = 0;        // its link listener
  int pid = 0;         // its process, for shared memory links (is the peer alive?)
  std::string memory;  // who can share memory with whom (communicator.cpp: memory_identity)
  GpuVote gpu;         // what it offers the NCCL backend

  std::string encode() const;
  static std::optional<PeerRecord> decode(std::string_view value);
};

struct AbortRecord {
  static constexpr std::uint32_t kMagic = 0x42414c4d;  // "MLAB"
  static constexpr std::uint16_t kVersion = 1;
  static constexpr std::size_t kMaxHost = 4096;
  static constexpr std::size_t kMaxMessage = 64 << 10;  // encode() cuts a longer message

  int culprit = -1;  // the rank at fault, -1 when none could be named
  std::string culprit_host;
  int reporter = -1;    // the rank that wrote the record
  std::string message;  // "rank 1 (h1): allreduce #3: ..." (may span lines)

  std::string encode() const;
  static std::optional<AbortRecord> decode(std::string_view value);
};

}  // namespace mltrain::comm::detail
