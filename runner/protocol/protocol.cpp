#include "runner/protocol/protocol.h"

#include <cstring>
#include <utility>

namespace mltrain::agent {

namespace {
void put_u32(std::string& out, uint32_t v) {
  char b[4] = {char(v), char(v >> 8), char(v >> 16), char(v >> 24)};
  out.append(b, 4);
}
uint32_t get_u32(const char* p) {
  auto u = reinterpret_cast<const unsigned char*>(p);
  return uint32_t(u[0]) | uint32_t(u[1]) << 8 | uint32_t(u[2]) << 16 | uint32_t(u[3]) << 24;
}
}  // namespace

Writer& Writer::u32(uint32_t v) {
  put_u32(buf_, v);
  return *this;
}
Writer& Writer::u64(uint64_t v) {
  put_u32(buf_, uint32_t(v));
  put_u32(buf_, uint32_t(v >> 32));
  return *this;
}
Writer& Writer::str(std::string_view s) {
  put_u32(buf_, static_cast<uint32_t>(s.size()));
  buf_.append(s);
  return *this;
}
Writer& Writer::strings(const std::vector<std::string>& v) {
  put_u32(buf_, static_cast<uint32_t>(v.size()));
  for (const auto& s : v) str(s);
  return *this;
}
Writer& Writer::ints(const std::vector<int32_t>& v) {
  put_u32(buf_, static_cast<uint32_t>(v.size()));
  for (int32_t i : v) i32(i);
  return *this;
}

bool Reader::take(void* out, size_t n) {
  if (failed_ || data_.size() < n) {
    failed_ = true;
    std::memset(out, 0, n);
    return false;
  }
  std::memcpy(out, data_.data(), n);
  data_.remove_prefix(n);
  return true;
}
uint32_t Reader::u32() {
  char b[4];
  take(b, 4);
  return get_u32(b);
}
uint64_t Reader::u64() {
  uint64_t lo = u32();
  uint64_t hi = u32();
  return lo | hi << 32;
}
std::string Reader::str() {
  uint32_t n = u32();
  if (failed_ || data_.size() < n) {
    failed_ = true;
    return {};
  }
  std::string s(data_.substr(0, n));
  data_.remove_prefix(n);
  return s;
}
std::vector<std::string> Reader::strings() {
  uint32_t n = u32();
  std::vector<std::string> v;
  // Each string takes at least 4 bytes: a count larger than that is a corrupt payload.
  if (failed_ || n > data_.size() / 4 || n > kMaxListStrings) {
    failed_ = true;
    return v;
  }
  v.reserve(n);
  for (uint32_t i = 0; i < n && !failed_; ++i) v.push_back(str());
  return v;
}
std::vector<int32_t> Reader::ints() {
  uint32_t n = u32();
  std::vector<int32_t> v;
  if (failed_ || n > data_.size() / 4) {
    failed_ = true;
    return v;
  }
  v.reserve(n);
  for (uint32_t i = 0; i < n; ++i) v.push_back(i32());
  return v;
}

void encode(std::string& out, Type type, uint32_t id, std::string_view payload, uint16_t flags) {
  put_u32(out, static_cast<uint32_t>(payload.size()));
  auto t = static_cast<uint16_t>(type);
  char b[4] = {char(t), char(t >> 8), char(flags), char(flags >> 8)};
  out.append(b, 4);
  put_u32(out, id);
  out.append(payload);
}

bool Decoder::next(Frame& f) {
  if (corrupt_ || buf_.size() - pos_ < kHeaderSize) return false;
  const char* p = buf_.data() + pos_;
  uint32_t len = get_u32(p);
  if (len > max_payload_) {
    corrupt_ = true;
    return false;
  }
  if (buf_.size() - pos_ < kHeaderSize + len) return false;
  auto u = reinterpret_cast<const unsigned char*>(p);
  f.type = static_cast<Type>(uint16_t(u[4]) | uint16_t(u[5]) << 8);
  f.flags = static_cast<uint16_t>(uint16_t(u[6]) | uint16_t(u[7]) << 8);
  f.id = get_u32(p + 8);
  f.payload.assign(p + kHeaderSize, len);
  pos_ += kHeaderSize + len;
  // Compact once the consumed prefix dominates, so the buffer stays small under heavy output.
  if (pos_ > (1u << 16) && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  return true;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::hello:
      return "hello";
    case Type::spawn:
      return "spawn";
    case Type::signal:
      return "signal";
    case Type::terminate:
      return "terminate";
    case Type::ping:
      return "ping";
    case Type::shutdown:
      return "shutdown";
    case Type::stdin_data:
      return "stdin";
    case Type::stdin_close:
      return "stdin_close";
    case Type::pause:
      return "pause";
    case Type::launcher_silent:
      return "launcher_silent";
    case Type::hello_ack:
      return "hello_ack";
    case Type::started:
      return "started";
    case Type::spawn_failed:
      return "spawn_failed";
    case Type::output:
      return "output";
    case Type::exited:
      return "exited";
    case Type::pong:
      return "pong";
    case Type::error:
      return "error";
    case Type::bye:
      return "bye";
    case Type::prepare:
      return "prepare";
    case Type::prepared:
      return "prepared";
    case Type::probe:
      return "probe";
    case Type::probed:
      return "probed";
    case Type::telemetry_start:
      return "telemetry_start";
    case Type::telemetry:
      return "telemetry";
    case Type::sync_manifest:
      return "sync_manifest";
    case Type::sync_data:
      return "sync_data";
    case Type::sync_end:
      return "sync_end";
    case Type::setup:
      return "setup";
    case Type::pull:
      return "pull";
    case Type::sync_want:
      return "sync_want";
    case Type::sync_done:
      return "sync_done";
    case Type::sync_written:
      return "sync_written";
    case Type::setup_done:
      return "setup_done";
    case Type::pull_file:
      return "pull_file";
    case Type::pull_data:
      return "pull_data";
    case Type::pull_done:
      return "pull_done";
    case Type::claim:
      return "claim";
    case Type::unclaim:
      return "unclaim";
    case Type::claimed:
      return "claimed";
    case Type::lease_query:
      return "lease_query";
    case Type::lease_list:
      return "lease_list";
    case Type::gc_work:
      return "gc_work";
    case Type::gc_done:
      return "gc_done";
    case Type::ps_log:
      return "ps_log";
    case Type::ps_stats:
      return "ps_stats";
  }
  return "unknown";
}

namespace {

// Reads the payload as the alternative of Message whose kType is `type` (the variant is the one
// list of messages); false when no alternative has it.
template <size_t... I>
bool read_alternative(Type type, Reader& r, Message& m, std::index_sequence<I...>) {
  auto read_if = [&]<size_t N>() {
    using M = std::variant_alternative_t<N, Message>;
    if (M::kType != type) return false;
    M message;
    message.get(r);
    m = std::move(message);
    return true;
  };
  return (read_if.template operator()<I>() || ...);
}

}  // namespace

std::optional<Message> decode(Frame&& f, std::string& error) {
  // Output and sync data, the bulk of the stream: their bytes are moved, never copied.
  if (f.type == Type::output) return msg::Output{f.flags, std::move(f.payload)};
  if (f.type == Type::sync_data) {
    Reader r(f.payload);
    msg::SyncData d;
    d.offset = r.u64(), d.raw_size = r.u32(), d.compressed = f.flags;
    if (r.failed()) {
      error = "malformed sync_data frame";
      return std::nullopt;
    }
    d.bytes = f.payload.substr(12);
    return d;
  }
  Reader r(f.payload);
  Message m;
  if (!read_alternative(f.type, r, m, std::make_index_sequence<std::variant_size_v<Message>>())) {
    error = "unknown frame type " + std::to_string(unsigned(f.type));
    return std::nullopt;
  }
  if (r.failed()) {
    error = std::string("malformed ") + type_name(f.type) + " frame (" + std::to_string(f.payload.size()) +
            " bytes)";
    return std::nullopt;
  }
  return m;
}

}  // namespace mltrain::agent
