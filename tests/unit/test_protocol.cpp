// The agent protocol: framing, field encoding, corrupt streams.
#include <doctest/doctest.h>

#include "runner/agent/protocol.h"

using namespace mltrain::agent;

TEST_CASE("protocol: frames round-trip, whole or byte by byte") {
  std::string wire;
  encode(wire, Type::spawn, 7, Writer().str("/tmp").strings({"a", "b c"}).strings({"K=V"}).take());
  encode(wire, Type::output, 3, std::string(100000, 'x'), 2);
  encode(wire, Type::ping, 0, {});

  for (size_t step : {wire.size(), size_t(1), size_t(4096)}) {
    Decoder d;
    std::vector<Frame> got;
    for (size_t off = 0; off < wire.size(); off += step) {
      d.feed(wire.data() + off, std::min(step, wire.size() - off));
      Frame f;
      while (d.next(f)) got.push_back(f);
    }
    REQUIRE(got.size() == 3);
    CHECK(got[0].type == Type::spawn);
    CHECK(got[0].id == 7);
    Reader r(got[0].payload);
    CHECK(r.str() == "/tmp");
    CHECK(r.strings() == std::vector<std::string>{"a", "b c"});
    CHECK(r.strings() == std::vector<std::string>{"K=V"});
    CHECK_FALSE(r.failed());
    CHECK(got[1].flags == 2);
    CHECK(got[1].payload.size() == 100000);
    CHECK(got[2].type == Type::ping);
    CHECK(d.buffered() == 0);
  }
}

TEST_CASE("protocol: integers are little-endian and 64-bit values survive") {
  std::string p = Writer().u32(0x01020304).u64(0x1122334455667788ULL).i32(-5).take();
  CHECK(static_cast<unsigned char>(p[0]) == 0x04);
  Reader r(p);
  CHECK(r.u32() == 0x01020304u);
  CHECK(r.u64() == 0x1122334455667788ULL);
  CHECK(r.i32() == -5);
}

TEST_CASE("protocol: short or lying payloads fail without reading past the end") {
  const std::string short_payload("\x05\x00\x00\x00" "ab", 6);  // a 5-byte string with 2 bytes
  Reader r(short_payload);
  CHECK(r.str().empty());
  CHECK(r.failed());

  const std::string lying("\xff\xff\xff\x7f", 4);  // claims two billion strings
  Reader many(lying);
  CHECK(many.strings().empty());
  CHECK(many.failed());
}

TEST_CASE("protocol: an oversized length marks the stream corrupt") {
  std::string wire = Writer().u32(kMaxPayload + 1).u32(1).u32(0).take();
  Decoder d;
  d.feed(wire.data(), wire.size());
  Frame f;
  CHECK_FALSE(d.next(f));
  CHECK(d.corrupt());
}
