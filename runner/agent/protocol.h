// The framed protocol between the launcher and its agent on each host (one byte stream per host:
// pipes on localhost, one SSH channel remotely). Compiled into both sides; depends on libc only.
//
// Frame: u32 payload length, u16 type, u16 flags, u32 id (a rank number, or kAllRanks), payload.
// All integers little-endian. The first frame each way is Hello, carrying kMagic and kVersion.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::agent {

inline constexpr uint32_t kMagic = 0x41544c4d;  // "MLTA"
inline constexpr uint32_t kVersion = 1;
inline constexpr uint32_t kAllRanks = 0xffffffffu;
inline constexpr uint32_t kMaxPayload = 64u << 20;  // a bigger frame means a corrupt stream
inline constexpr size_t kHeaderSize = 12;

enum class Type : uint16_t {
  // launcher -> agent
  hello = 1,      // magic, version, grace_ms, heartbeat_timeout_ms
  spawn = 2,      // id = rank; cwd, argv[], env[] ("K=V", set over the agent's own environment)
  signal = 3,     // id = rank or kAllRanks; signo
  terminate = 4,  // TERM every rank's process group, wait grace_ms, then KILL
  ping = 5,       // seq; answered by pong
  shutdown = 6,   // kill whatever is left and exit
  prepare = 7,    // preflight: master_addr, nports, workdir, argv0, path ("" = the agent's PATH)
  probe = 8,      // doctor: port to test; answered by probed
  // agent -> launcher
  hello_ack = 101,  // magic, version, pid, hostname, arch
  started = 102,    // id = rank; pid
  spawn_failed = 103,  // id = rank; message
  output = 104,     // id = rank, flags = stream (1 stdout, 2 stderr); raw bytes
  exited = 105,     // id = rank; wait status (as waitpid gives it)
  pong = 106,       // seq
  error = 107,      // message: something the agent could not do
  bye = 108,        // the agent is exiting after shutdown
  prepared = 109,   // ifname routing to master_addr, local ip, ports[] (as strings), problems[]
  probed = 110,     // facts[] as "key=value" (arch, glibc, gpus, nccl, python3, torch, time_ms, port_free)
};

struct Frame {
  Type type{};
  uint16_t flags = 0;
  uint32_t id = 0;
  std::string payload;
};

// Builds a payload from fields.
class Writer {
 public:
  Writer& u32(uint32_t v);
  Writer& i32(int32_t v) { return u32(static_cast<uint32_t>(v)); }
  Writer& u64(uint64_t v);
  Writer& str(std::string_view s);
  Writer& strings(const std::vector<std::string>& v);
  std::string take() { return std::move(buf_); }

 private:
  std::string buf_;
};

// Reads fields back; any read past the end sets failed() and yields zero values.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}
  uint32_t u32();
  int32_t i32() { return static_cast<int32_t>(u32()); }
  uint64_t u64();
  std::string str();
  std::vector<std::string> strings();
  bool failed() const { return failed_; }

 private:
  bool take(void* out, size_t n);
  std::string_view data_;
  bool failed_ = false;
};

// Appends a whole frame (header and payload) to `out`.
void encode(std::string& out, Type type, uint32_t id, std::string_view payload, uint16_t flags = 0);

// Accumulates bytes from a stream and yields complete frames.
class Decoder {
 public:
  void feed(const char* data, size_t n) { buf_.append(data, n); }
  // Returns true and fills `f` when a whole frame is buffered. Sets corrupt() on a bad length.
  bool next(Frame& f);
  bool corrupt() const { return corrupt_; }
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  bool corrupt_ = false;
};

const char* type_name(Type t);

}  // namespace mltrain::agent
