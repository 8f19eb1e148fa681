// The agent protocol: framing, field encoding, corrupt streams.
#include <doctest/doctest.h>

#include <variant>

#include "runner/protocol/protocol.h"

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
  const std::string short_payload(
      "\x05\x00\x00\x00"
      "ab",
      6);  // a 5-byte string with 2 bytes
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

TEST_CASE("protocol: the launcher's decoder takes at most kMaxHostPayload from a host") {
  std::string wire = Writer().u32(kMaxHostPayload + 1).u32(1).u32(0).take();
  Decoder from_host(kMaxHostPayload), any;
  from_host.feed(wire.data(), wire.size());
  any.feed(wire.data(), wire.size());
  Frame f;
  CHECK_FALSE(from_host.next(f));
  CHECK(from_host.corrupt());
  CHECK_FALSE(any.next(f));  // the frame is not whole yet, but nothing is wrong with it
  CHECK_FALSE(any.corrupt());
}

TEST_CASE("protocol: a list of more than kMaxListStrings strings is refused, however short they are") {
  Writer w;
  w.u32(kMaxListStrings + 1);
  std::string empty(4 * size_t(kMaxListStrings + 1), '\0');  // that many empty strings
  w.raw(empty);
  std::string payload = w.take();
  Reader r(payload);
  CHECK(r.strings().empty());
  CHECK(r.failed());
  Writer ok;
  ok.u32(3).str("").str("").str("");
  std::string p2 = ok.take();
  Reader r2(p2);
  CHECK(r2.strings().size() == 3);
  CHECK_FALSE(r2.failed());
}

namespace {

// Encodes `m` as a frame, decodes it back and checks it is the same message with the same id.
template <class M>
void round_trip(const M& m, uint32_t id) {
  CAPTURE(type_name(M::kType));
  std::string wire;
  encode(wire, m, id);
  Decoder d;
  d.feed(wire.data(), wire.size());
  Frame f;
  REQUIRE(d.next(f));
  CHECK(f.type == M::kType);
  CHECK(f.id == id);
  std::string error;
  auto got = decode(std::move(f), error);
  REQUIRE_MESSAGE(got, error);
  REQUIRE(std::holds_alternative<M>(*got));
  CHECK(std::get<M>(*got) == m);
  CHECK(d.buffered() == 0);
}

const Gpu kH100{3, "GPU-4049c22c-0000-4000-8000-000000000003", "NVIDIA H100 80GB HBM3", 81559, 1};
const msg::Prepare kPrepare{"10.0.0.1",
                            3,
                            "/tmp",
                            "train.py",
                            "/usr/bin:/bin",
                            29500,
                            8,
                            "/opt/libnvidia-ml.so.1",
                            1,
                            "1,3",
                            1,
                            "/opt/nccl/libnccl.so.2",
                            {1, 3},
                            4,
                            0,
                            "t0ken",
                            "sgd",
                            "0.10000000000000001",
                            "0.9",
                            "0",
                            "25%",
                            1};
const msg::Probe kProbe{29500,
                        "/opt/venv/bin/python",
                        "/opt/venv/bin:/usr/bin",
                        "/opt/libnvidia-ml.so.1",
                        1,
                        "",
                        "/home/u/proj",
                        "torchrun"};
const msg::Prepared kPrepared{"eth0",
                              "10.0.0.2",
                              {"29500", "29501"},
                              {"program x not found"},
                              1,
                              {kH100, {}},
                              {3, 0},
                              "nvml",
                              "",
                              1,
                              "3,0",
                              {40001, 40002},
                              {"os=Debian GNU/Linux 12 (bookworm)", "torch=2.5.1+cu121"}};
const msg::Probed kProbed{{"arch=x86_64", "gpus=1"}, {kH100}};
const SyncEntry kFileEntry{"src/train.py",
                           SyncEntry::file,
                           0755,
                           1234,
                           1700000000123456789,
                           std::string("\x01\x00\xff", 3) + std::string(13, 'h'),
                           ""};
const SyncEntry kLinkEntry{"data", SyncEntry::symlink, 0777, 0, -5, "", "/mnt/shared/data"};
const msg::SyncManifest kManifest{
    "~/jobs/w d", {kFileEntry, kLinkEntry}, 0, "0001733480100000000000-20261206-101500-w-1a2b"};
const msg::SyncData kSyncData{512u << 10, 262144, 1, std::string("\x28\xb5\x2f\xfd\0z", 6)};
const msg::Setup kSetup{"~/jobs/w", "pip install -r requirements.txt", {"A=1", "PIP_NO_INPUT=1"}, "k3y", 1};
const msg::Pull kPull{"~/jobs/w", {"out/**", "*.ckpt", "!tmp/"}, 1ull << 33};
const msg::SyncWant kSyncWant{"/home/u/jobs/w@2", {0, 7, 4095}, 3, {"cannot remove x: busy"}, 2};
const msg::SyncDone kSyncDone{2, 5000000000ull, {"disk full"}};
const msg::SetupDone kSetupDone{1, 256, "sh: not found"};
const msg::PullFile kPullFile{"out/model.ckpt", 0640, 1ull << 32, 1700000000000000001};
const msg::PullData kPullData{std::string("a\0b", 3)};
const msg::PullDone kPullDone{1, 3, {"too big: out/huge"}};
const msg::PsLog kPsLog{3, 1, "out of memory"};
const msg::PsStats kPsStats{{{0, 40001, 1ull << 40, 5, 100, 7, 4, 1, 3}, {2, 40002, 0, 0, 0, 0, 0, 0, 0}}};

// One message of every type, with every field set to something other than its default.
std::vector<std::string> one_of_each() {
  std::vector<std::string> frames;
  auto add = [&](const auto& m, uint32_t id) {
    std::string w;
    encode(w, m, id);
    frames.push_back(w);
  };
  add(msg::Hello{kMagic, kVersion, 5000, 10000}, 0);
  add(msg::Spawn{"/w d", {"python3", "-c", "print(1)", ""}, {"A=1", "B=x=y"}, 1}, 3);
  add(msg::Signal{2}, kAllRanks);
  add(msg::Terminate{1500}, kAllRanks);
  add(msg::Ping{0x0123456789abcdefULL}, 0);
  add(msg::Shutdown{}, 0);
  add(msg::Claim{"20261206-101500-bert",
                 "0001733480100000000000-20261206-101500-bert",
                 "",
                 2,
                 0,
                 {0, 1},
                 {"user=alice", "launcher=laptop"}},
      0);
  add(msg::Unclaim{}, 0);
  add(msg::Claimed{2,
                   {},
                   1,
                   {"what=gpu 0\nrun=r1\nuid=1000\n"},
                   "",
                   {"name=exclusive\nuid=65534\ndoubt=it is not an mltrain agent\n"}},
      0);
  add(msg::LeaseQuery{"t-1", "/opt/libnvidia-ml.so.1"}, 0);
  add(msg::LeaseList{{"name=gpu/GPU-1\nuid=1000\nrun=r1\n"}, {kH100}, {87}, {1}, ""}, 0);
  add(msg::GcWork{86400, 1}, 0);
  add(msg::SyncWritten{uint64_t(5) << 32}, 0);
  add(msg::GcDone{{"name=proj-1a2b3c4d@2\nstate=removed\nbytes=100\n"}, {"cannot remove x: busy"}}, 0);
  add(kPrepare, 0);
  add(kProbe, 0);
  add(msg::Stdin{std::string("c\n\0", 3)}, 0);
  add(msg::StdinClose{}, 0);
  add(msg::Pause{}, 0);
  add(msg::LauncherSilent{10000}, 0);
  add(msg::HelloAck{kMagic, kVersion, 4242, "h1", "x86_64"}, 0);
  add(msg::Started{777}, 5);
  add(msg::SpawnFailed{"exec: No such file or directory"}, 5);
  add(msg::Output{2, std::string("a\0b\r\n", 5)}, 6);
  add(msg::Exited{256, "{}", 1}, 6);
  add(msg::Pong{99}, 0);
  add(msg::AgentError{"unexpected frame"}, 0);
  add(msg::Bye{}, 0);
  add(kPrepared, 0);
  add(kProbed, 0);
  add(msg::TelemetryStart{200, "/opt/libnvidia-ml.so.1"}, 0);
  add(msg::Telemetry{"MLTEL 1 t=5\nhost ncpu=4\n"}, 0);
  add(kManifest, 0);
  add(kSyncData, 4);
  add(msg::SyncEnd{}, 0);
  add(kSetup, 0);
  add(kPull, 0);
  add(kSyncWant, 0);
  add(kSyncDone, 0);
  add(kSetupDone, 0);
  add(kPullFile, 2);
  add(kPullData, 2);
  add(kPullDone, 0);
  add(kPsLog, 0);
  add(kPsStats, 0);
  return frames;
}

}  // namespace

TEST_CASE("protocol: every message round-trips through its struct") {
  round_trip(msg::Hello{kMagic, kVersion, 5000, 10000}, 0);
  round_trip(msg::Spawn{"/w d", {"python3", "-c", "print(1)", ""}, {"A=1", "B=x=y"}, 1}, 3);
  round_trip(msg::Spawn{"/", {"x"}, {}, 0, 0}, 4);     // python_path off
  round_trip(msg::Spawn{"/", {"x"}, {}, 0, 1, 1}, 4);  // stdout and stderr one pipe
  round_trip(msg::Signal{2}, kAllRanks);
  round_trip(msg::Terminate{1500}, kAllRanks);
  round_trip(msg::Ping{0x0123456789abcdefULL}, 0);
  round_trip(msg::Shutdown{}, 0);
  round_trip(kPrepare, 0);
  round_trip(msg::Prepare{}, 0);
  round_trip(kProbe, 0);
  round_trip(msg::Stdin{std::string("c\n\0", 3)}, 0);
  round_trip(msg::StdinClose{}, 0);
  round_trip(msg::Pause{}, 0);
  round_trip(msg::LauncherSilent{10000}, 0);
  round_trip(msg::HelloAck{kMagic, kVersion, 4242, "h1", "x86_64"}, 0);
  round_trip(msg::Started{777}, 5);
  round_trip(msg::SpawnFailed{"exec: No such file or directory"}, 5);
  round_trip(msg::Output{2, std::string("a\0b\r\n", 5)}, 6);
  round_trip(msg::Output{1, ""}, 6);
  round_trip(msg::Exited{9, "", 1}, 6);
  round_trip(msg::Exited{256, "{\"message\": \"boom\"}", 0}, 6);
  round_trip(msg::Pong{99}, 0);
  round_trip(msg::AgentError{"unexpected frame"}, 0);
  round_trip(msg::Bye{}, 0);
  round_trip(kPrepared, 0);
  round_trip(msg::Prepared{}, 0);
  round_trip(kProbed, 0);
  round_trip(msg::TelemetryStart{200, "/opt/libnvidia-ml.so.1"}, 0);
  round_trip(msg::TelemetryStart{}, 0);
  round_trip(msg::TelemetryStart{1000, "", 1}, 0);
  round_trip(msg::Telemetry{"MLTEL 1 t=5\nhost ncpu=4\n"}, 0);
  round_trip(msg::Telemetry{}, 0);
  round_trip(kManifest, 0);
  round_trip(msg::SyncManifest{}, 0);
  round_trip(msg::SyncManifest{"/abs", {SyncEntry{"empty", SyncEntry::dir, 0700, 0, 0, "", ""}}, 1, ""}, 0);
  round_trip(msg::SyncManifest{"/abs", {}, 1, "20261206-101500-bert-1a2b"}, 0);
  round_trip(kSyncData, 4);
  round_trip(msg::SyncData{0, 5, 0, "hello"}, 9);  // raw
  round_trip(msg::SyncData{}, 0);                  // an empty file
  round_trip(msg::SyncEnd{}, 0);
  round_trip(kSetup, 0);
  round_trip(msg::Setup{}, 0);
  round_trip(kPull, 0);
  round_trip(msg::Pull{}, 0);
  round_trip(kSyncWant, 0);
  round_trip(msg::SyncWant{}, 0);
  round_trip(kSyncDone, 0);
  round_trip(kSetupDone, 0);
  round_trip(msg::SetupDone{0, -1, ""}, 0);
  round_trip(kPullFile, 2);
  round_trip(kPullData, 2);
  round_trip(msg::PullData{}, 2);
  round_trip(kPullDone, 0);
  round_trip(msg::PullDone{}, 0);
  round_trip(kPsLog, 0);
  round_trip(kPsStats, 0);
  round_trip(msg::PsStats{}, 0);
  CHECK(one_of_each().size() == std::variant_size_v<Message>);
}

TEST_CASE("protocol: messages from a peer without the GPU fields decode with their defaults") {
  // Prepare, Prepared, Probe and Probed gained fields at their end; an older peer's frames lack them.
  std::string error;
  Frame prepare{Type::prepare, 0, 0, Writer().str("").u32(0).str("/w").str("prog").str("").u32(0).take()};
  auto p = decode(std::move(prepare), error);
  REQUIRE_MESSAGE(p, error);
  CHECK(std::get<msg::Prepare>(*p).gpu_slots_needed == 0);
  CHECK(std::get<msg::Prepare>(*p).workdir == "/w");
  Frame prepared{Type::prepared, 0, 0,
                 Writer().str("eth0").str("10.0.0.2").strings({}).strings({}).u32(0).take()};
  auto q = decode(std::move(prepared), error);
  REQUIRE_MESSAGE(q, error);
  CHECK(std::get<msg::Prepared>(*q).gpus.empty());
  Frame probed{Type::probed, 0, 0, Writer().strings({"gpus=0"}).take()};
  auto r = decode(std::move(probed), error);
  REQUIRE_MESSAGE(r, error);
  CHECK(std::get<msg::Probed>(*r).facts == std::vector<std::string>{"gpus=0"});
  Frame probe{Type::probe, 0, 0,
              Writer().u32(0).str("python3.11").str("").str("").u32(0).str("").take()};  // before workdir
  auto o = decode(std::move(probe), error);
  REQUIRE_MESSAGE(o, error);
  CHECK(std::get<msg::Probe>(*o).python == "python3.11");
  CHECK(std::get<msg::Probe>(*o).workdir.empty());
  // A GPU count larger than the payload could hold is a malformed frame, not a huge allocation.
  Frame lying{Type::probed, 0, 0, Writer().strings({}).u32(0x7fffffff).take()};
  CHECK_FALSE(decode(std::move(lying), error));
}

TEST_CASE("protocol: a truncated payload or an unknown type is a clean decode error") {
  std::string error;
  Frame f{Type::prepared, 0, 0, Writer().str("eth0").take()};
  CHECK_FALSE(decode(std::move(f), error));
  CHECK(error.find("malformed prepared frame") != std::string::npos);
  // A manifest that claims more entries than its payload could hold: no huge allocation.
  Frame many{Type::sync_manifest, 0, 0, Writer().str("d").u32(1000000).take()};
  CHECK_FALSE(decode(std::move(many), error));
  Frame u{Type(999), 0, 0, {}};
  CHECK_FALSE(decode(std::move(u), error));
  CHECK(error.find("unknown frame type 999") != std::string::npos);
}

// The decoder's fuzz target: random bytes, and valid streams with bytes flipped, inserted and
// cut, fed in random pieces. Whatever comes in, decoding ends (no hang), reads nothing past the
// buffer (the sanitizer build runs this too) and either yields messages or says what was wrong.
TEST_CASE("protocol: fuzzed streams never crash or hang the decoder") {
  uint64_t state = 0x9e3779b97f4a7c15ULL;
  auto next = [&] {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    return state;
  };
  const auto valid = one_of_each();
  size_t decoded = 0, rejected = 0, corrupt = 0;
  for (int round = 0; round < 3000; ++round) {
    std::string wire;
    if (round % 4 == 0) {
      wire.resize(next() % 256);
      for (auto& c : wire) c = char(next());
    } else {
      for (int k = 0, n = int(next() % 6) + 1; k < n; ++k) wire += valid[next() % valid.size()];
      for (int k = 0, n = int(next() % 4); k < n && !wire.empty(); ++k) {
        size_t at = next() % wire.size();
        switch (next() % 3) {
          case 0:
            wire[at] = char(next());
            break;
          case 1:
            wire.insert(at, 1, char(next()));
            break;
          default:
            wire.resize(at);
            break;
        }
      }
    }
    Decoder d;
    size_t off = 0;
    while (off < wire.size() && !d.corrupt()) {
      size_t piece = std::min<size_t>(wire.size() - off, 1 + next() % 64);
      d.feed(wire.data() + off, piece);
      off += piece;
      Frame f;
      while (d.next(f)) {
        std::string error;
        if (decode(std::move(f), error))
          ++decoded;
        else {
          CHECK_FALSE(error.empty());
          ++rejected;
        }
      }
    }
    corrupt += d.corrupt();
  }
  // The mutations reach every outcome: good messages, rejected ones, and corrupt streams.
  CHECK(decoded > 1000);
  CHECK(rejected > 10);
  CHECK(corrupt > 10);
}
