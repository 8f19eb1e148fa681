#include "rendezvous/records.h"

#include "core/wire.h"

namespace mltrain::comm::detail {

namespace {

// The first fields of every record: its magic and version.
void put_header(std::string& out, std::uint32_t magic, std::uint16_t version) {
  wire::put(out, magic);
  wire::put(out, version);
}
bool header_is(wire::Reader& in, std::uint32_t magic, std::uint16_t version) {
  const auto got_magic = in.get<std::uint32_t>();
  const auto got_version = in.get<std::uint16_t>();
  return in.ok() && got_magic == magic && got_version == version;
}

std::string_view bounded(const std::string& text, std::size_t max) {
  return std::string_view(text).substr(0, max);
}

}  // namespace

std::string PeerRecord::encode() const {
  std::string out;
  put_header(out, kMagic, kVersion);
  wire::put(out, static_cast<std::uint8_t>((gpu.gpu ? 1 : 0) | (gpu.nccl ? 2 : 0)));
  wire::put(out, static_cast<std::int32_t>(port));
  wire::put(out, static_cast<std::int32_t>(pid));
  for (const std::string* field : {&host, &ip, &memory, &gpu.device, &gpu.nccl_version, &gpu.why})
    wire::put_text(out, bounded(*field, kMaxField));
  return out;
}

std::optional<PeerRecord> PeerRecord::decode(std::string_view value) {
  wire::Reader in(value);
  if (!header_is(in, kMagic, kVersion)) return std::nullopt;
  PeerRecord r;
  const auto flags = in.get<std::uint8_t>();
  r.gpu.gpu = (flags & 1) != 0;
  r.gpu.nccl = (flags & 2) != 0;
  r.port = in.get<std::int32_t>();
  r.pid = in.get<std::int32_t>();
  for (std::string* field : {&r.host, &r.ip, &r.memory, &r.gpu.device, &r.gpu.nccl_version, &r.gpu.why})
    *field = in.text(kMaxField);
  if (!in.ok() || !in.at_end() || flags > 3 || r.port < 0 || r.port > 65535 || r.pid < 0) return std::nullopt;
  return r;
}

std::string AbortRecord::encode() const {
  std::string out;
  put_header(out, kMagic, kVersion);
  wire::put(out, static_cast<std::int32_t>(culprit));
  wire::put(out, static_cast<std::int32_t>(reporter));
  wire::put_text(out, bounded(culprit_host, kMaxHost));
  wire::put_text(out, bounded(message, kMaxMessage));
  return out;
}

std::optional<AbortRecord> AbortRecord::decode(std::string_view value) {
  wire::Reader in(value);
  if (!header_is(in, kMagic, kVersion)) return std::nullopt;
  AbortRecord r;
  r.culprit = in.get<std::int32_t>();
  r.reporter = in.get<std::int32_t>();
  r.culprit_host = in.text(kMaxHost);
  r.message = in.text(kMaxMessage);
  if (!in.ok() || !in.at_end() || r.culprit < -1 || r.reporter < -1) return std::nullopt;
  return r;
}

}  // namespace mltrain::comm::detail
