// The framed protocol between the launcher and its agent on each host (one byte stream per host:
// pipes on localhost, one SSH channel remotely). Compiled into both sides; depends on libc only.
//
// Frame: u32 payload length, u16 type, u16 flags, u32 id (a rank number, or kAllRanks), payload.
// All integers little-endian. The first frame each way is Hello, carrying kMagic and kVersion.
// Payloads are the msg:: structs below; type_name() names a type for messages.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <variant>
#include <vector>

namespace mltrain::agent {

inline constexpr uint32_t kMagic = 0x41544c4d;  // "MLTA"
// 2: stdin forwarding, fixed master port, doctor interpreter; 3: pause; 4: telemetry; 5: top's watch;
// 6: workdir sync, setup, pull; 7: PS servers
inline constexpr uint32_t kVersion = 7;
inline constexpr uint32_t kAllRanks = 0xffffffffu;
inline constexpr uint32_t kSetupId = 0xfffffffeu;   // the frame id of the setup command's output
inline constexpr uint32_t kMaxPayload = 64u << 20;  // a bigger frame means a corrupt stream
// What the launcher takes from a host (which may be hostile): a frame's payload, and the strings
// in one list (each costs a std::string however short), so one host's frames stay a few tens of
// MiB in the launcher's memory.
inline constexpr uint32_t kMaxHostPayload = 16u << 20;
inline constexpr uint32_t kMaxListStrings = 1u << 20;
inline constexpr size_t kHeaderSize = 12;

enum class Type : uint16_t {
  // launcher -> agent
  hello = 1,
  spawn = 2,
  signal = 3,
  terminate = 4,
  ping = 5,
  shutdown = 6,
  prepare = 7,
  probe = 8,
  stdin_data = 9,
  stdin_close = 10,
  pause = 11,
  telemetry_start = 12,
  sync_manifest = 13,
  sync_data = 14,
  sync_end = 15,
  setup = 16,
  pull = 17,
  claim = 18,
  unclaim = 19,
  lease_query = 20,
  gc_work = 21,
  // agent -> launcher
  hello_ack = 101,
  started = 102,
  spawn_failed = 103,
  output = 104,
  exited = 105,
  pong = 106,
  error = 107,
  bye = 108,
  prepared = 109,
  probed = 110,
  launcher_silent = 111,
  telemetry = 112,
  sync_want = 113,
  sync_done = 114,
  setup_done = 115,
  pull_file = 116,
  pull_data = 117,
  pull_done = 118,
  ps_log = 119,
  ps_stats = 120,
  claimed = 121,
  lease_list = 122,
  gc_done = 123,
  sync_written = 124,
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
  Writer& ints(const std::vector<int32_t>& v);
  Writer& raw(std::string_view s) {
    buf_.append(s);
    return *this;
  }
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
  std::vector<int32_t> ints();
  size_t left() const { return data_.size(); }
  void fail() { failed_ = true; }
  std::string rest() {  // everything not read yet
    std::string s(data_);
    data_ = {};
    return s;
  }
  bool failed() const { return failed_; }

 private:
  bool take(void* out, size_t n);
  std::string_view data_;
  bool failed_ = false;
};

// Appends a whole frame (header and payload) to `out`.
void encode(std::string& out, Type type, uint32_t id, std::string_view payload, uint16_t flags = 0);

// Accumulates bytes from a stream and yields complete frames of at most `max_payload` bytes.
class Decoder {
 public:
  explicit Decoder(uint32_t max_payload = kMaxPayload) : max_payload_(max_payload) {}
  void feed(const char* data, size_t n) { buf_.append(data, n); }
  // Returns true and fills `f` when a whole frame is buffered. Sets corrupt() on a bad length.
  bool next(Frame& f);
  bool corrupt() const { return corrupt_; }
  size_t buffered() const { return buf_.size() - pos_; }

 private:
  std::string buf_;
  size_t pos_ = 0;
  bool corrupt_ = false;
  uint32_t max_payload_;
};

const char* type_name(Type t);

// One GPU as a host's agent found it (runner/agent/gpu_inventory.h); travels in Prepared and Probed.
struct Gpu {
  bool operator==(const Gpu&) const = default;
  int32_t index = 0;  // NVML's index: PCI bus order, as CUDA numbers GPUs with CUDA_DEVICE_ORDER=PCI_BUS_ID
  std::string uuid;   // "GPU-..."
  std::string name;   // "NVIDIA H100 80GB HBM3"
  uint64_t memory_mib = 0;  // 0: unknown (nvidia-smi -L does not say)
  int32_t mig = -1;         // MIG mode: -1 unknown, 0 off, 1 on
  void put(Writer& w) const { w.i32(index).str(uuid).str(name).u64(memory_mib).i32(mig); }
  void get(Reader& r) {
    index = r.i32(), uuid = r.str(), name = r.str(), memory_mib = r.u64(), mig = r.i32();
  }
};
inline void put_gpus(Writer& w, const std::vector<Gpu>& gpus) {
  w.u32(static_cast<uint32_t>(gpus.size()));
  for (const auto& g : gpus) g.put(w);
}
inline std::vector<Gpu> get_gpus(Reader& r) {
  uint32_t n = r.u32();
  std::vector<Gpu> gpus;
  if (n > r.left() / 24) {  // each takes at least 24 bytes: a larger count is a corrupt payload
    r.fail();
    return gpus;
  }
  gpus.resize(n);
  for (auto& g : gpus) g.get(r);
  return gpus;
}

// One entry of a synced tree (runner/sync/manifest.h builds them; the agent mirrors them).
struct SyncEntry {
  enum Kind : uint32_t { file = 0, dir = 1, symlink = 2 };
  bool operator==(const SyncEntry&) const = default;
  std::string path;  // relative, '/'-separated, no "." or ".." parts
  uint32_t kind = file;
  uint32_t mode = 0;  // permission bits (07777)
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  std::string hash;    // files: XXH3-128 of the content, 16 bytes
  std::string target;  // symlinks: where it points, as written
  void put(Writer& w) const {
    w.str(path).u32(kind).u32(mode).u64(size).u64(uint64_t(mtime_ns)).str(hash).str(target);
  }
  void get(Reader& r) {
    path = r.str(), kind = r.u32(), mode = r.u32(), size = r.u64(), mtime_ns = int64_t(r.u64());
    hash = r.str(), target = r.str();
  }
};

// One struct per message, each with its payload's encoder (put) and decoder (get); the frame's id
// (a rank, or kAllRanks) travels beside it. Decoding checks every read in one place (decode()).
// Trailing bytes are allowed, so a newer peer may append fields without breaking an older one.
namespace msg {

// launcher -> agent
struct Hello {
  static constexpr Type kType = Type::hello;
  bool operator==(const Hello&) const = default;
  uint32_t magic = kMagic, version = kVersion;
  uint32_t grace_ms = 0;
  uint32_t heartbeat_timeout_ms = 0;  // 0: never give up on a silent launcher (pipes see EOF)
  void put(Writer& w) const { w.u32(magic).u32(version).u32(grace_ms).u32(heartbeat_timeout_ms); }
  void get(Reader& r) {
    magic = r.u32(), version = r.u32(), grace_ms = r.u32(), heartbeat_timeout_ms = r.u32();
  }
};
struct Spawn {  // id = rank
  static constexpr Type kType = Type::spawn;
  bool operator==(const Spawn&) const = default;
  std::string cwd;
  std::vector<std::string> argv, env;  // env: "K=V", set over the agent's own environment
  uint32_t stdin_pipe = 0;             // 1: the rank's stdin is a pipe fed by Stdin frames, else /dev/null
  uint32_t python_path = 1;            // 1: the runtime's Python package goes first on PYTHONPATH
  // 1: the rank's stdout and stderr are one pipe, as when both are one terminal: its output comes
  // in the order it wrote it, all as stream 1. 0: a pipe each (the order between them is lost).
  uint32_t one_stream = 0;
  void put(Writer& w) const {
    w.str(cwd).strings(argv).strings(env).u32(stdin_pipe).u32(python_path).u32(one_stream);
  }
  void get(Reader& r) {
    cwd = r.str(), argv = r.strings(), env = r.strings(), stdin_pipe = r.u32(), python_path = r.u32();
    if (r.left() > 0) one_stream = r.u32();
  }
};
struct Stdin {  // id = rank; bytes for the stdin of a rank spawned with stdin_pipe
  static constexpr Type kType = Type::stdin_data;
  bool operator==(const Stdin&) const = default;
  std::string bytes;
  void put(Writer& w) const { w.raw(bytes); }
  void get(Reader& r) { bytes = r.rest(); }
};
struct StdinClose {  // id = rank; the launcher's stdin ended: close the rank's stdin (EOF)
  static constexpr Type kType = Type::stdin_close;
  bool operator==(const StdinClose&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};
struct Signal {  // id = rank or kAllRanks
  static constexpr Type kType = Type::signal;
  bool operator==(const Signal&) const = default;
  int32_t signo = 0;
  void put(Writer& w) const { w.i32(signo); }
  void get(Reader& r) { signo = r.i32(); }
};
struct Terminate {  // TERM every rank's process group, wait grace_ms, then KILL
  static constexpr Type kType = Type::terminate;
  bool operator==(const Terminate&) const = default;
  uint32_t grace_ms = 0;
  void put(Writer& w) const { w.u32(grace_ms); }
  void get(Reader& r) { grace_ms = r.u32(); }
};
struct Ping {
  static constexpr Type kType = Type::ping;
  bool operator==(const Ping&) const = default;
  uint64_t seq = 0;
  void put(Writer& w) const { w.u64(seq); }
  void get(Reader& r) { seq = r.u64(); }
};
struct Shutdown {  // kill whatever is left and exit
  static constexpr Type kType = Type::shutdown;
  bool operator==(const Shutdown&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};
struct Prepare {  // preflight
  static constexpr Type kType = Type::prepare;
  bool operator==(const Prepare&) const = default;
  std::string master_addr;  // "" on one host
  uint32_t nports = 0;      // free ports to find (rank 0's host only)
  std::string workdir, argv0;
  std::string path;         // the ranks' PATH; "" = the agent's own
  uint32_t fixed_port = 0;  // a fixed master_port that must be free here (rank 0's host); 0: none
  // GPUs: how many usable GPUs this host's ranks need ([gpus]); 0: none asked, nothing is probed.
  uint32_t gpu_slots_needed = 0;
  std::string nvml_library;  // the job's MLTRAIN_NVML_LIBRARY; "": the agent's own, else libnvidia-ml.so.1
  uint32_t has_cuda_visible_devices = 0;  // 1: the job sets CUDA_VISIBLE_DEVICES to this value;
  std::string cuda_visible_devices;       // 0: the agent's own environment's applies, if any
  // [comm] backend = "nccl": NCCL must load here (the job's MLTRAIN_NCCL_LIBRARY, else the default).
  uint32_t nccl_required = 0;
  std::string nccl_library;
  // PS mode: the servers this host's agent runs (their numbers in the job; empty: none), for how
  // many workers, proving which token, summing rounds (sync) or applying an optimizer at once.
  std::vector<int32_t> ps_servers;
  uint32_t ps_workers = 0, ps_sync = 1;
  std::string ps_token, ps_optimizer;
  std::string ps_lr, ps_momentum, ps_weight_decay;  // decimal text
  // What this host's servers may hold together: "N" bytes or "P%" of the host's memory (the
  // smaller of MemTotal and the agent's cgroup limit); "": 50%.
  std::string ps_memory;
  uint32_t facts = 0;  // 1: say what the run records of this host (Prepared::facts)
  void put(Writer& w) const {
    w.str(master_addr).u32(nports).str(workdir).str(argv0).str(path).u32(fixed_port);
    w.u32(gpu_slots_needed).str(nvml_library).u32(has_cuda_visible_devices).str(cuda_visible_devices);
    w.u32(nccl_required).str(nccl_library);
    w.ints(ps_servers).u32(ps_workers).u32(ps_sync).str(ps_token).str(ps_optimizer);
    w.str(ps_lr).str(ps_momentum).str(ps_weight_decay);
    w.str(ps_memory);
    w.u32(facts);
  }
  void get(Reader& r) {
    master_addr = r.str(), nports = r.u32(), workdir = r.str(), argv0 = r.str(), path = r.str();
    fixed_port = r.u32();
    if (r.left() == 0) return;  // from a launcher without GPU fields
    gpu_slots_needed = r.u32(), nvml_library = r.str(), has_cuda_visible_devices = r.u32();
    cuda_visible_devices = r.str();
    if (r.left() == 0) return;  // from a launcher without the NCCL check
    nccl_required = r.u32(), nccl_library = r.str();
    if (r.left() == 0) return;  // from a launcher without PS servers
    ps_servers = r.ints(), ps_workers = r.u32(), ps_sync = r.u32(), ps_token = r.str(),
    ps_optimizer = r.str();
    ps_lr = r.str(), ps_momentum = r.str(), ps_weight_decay = r.str();
    if (r.left() == 0) return;  // from a launcher without a PS memory budget
    ps_memory = r.str();
    if (r.left() == 0) return;  // from a launcher that records no host facts
    facts = r.u32();
  }
};
struct Probe {  // doctor
  static constexpr Type kType = Type::probe;
  bool operator==(const Probe&) const = default;
  uint32_t port = 0;  // to test for being free; 0: none
  // The interpreter the job runs: the job's program when it is a python (a path, relative to
  // `workdir`, or a name looked up in `path`), or "" for python3; `path` is the ranks' PATH ("" =
  // the agent's own).
  std::string python, path;
  // Where to look for GPUs, as in Prepare.
  std::string nvml_library;
  uint32_t has_cuda_visible_devices = 0;
  std::string cuda_visible_devices;
  // The ranks' folder, and the job's program when it is not a python itself (torchrun): the agent
  // follows its #! line to the interpreter.
  std::string workdir, program;
  void put(Writer& w) const {
    w.u32(port)
        .str(python)
        .str(path)
        .str(nvml_library)
        .u32(has_cuda_visible_devices)
        .str(cuda_visible_devices)
        .str(workdir)
        .str(program);
  }
  void get(Reader& r) {
    port = r.u32(), python = r.str(), path = r.str();
    if (r.left() == 0) return;
    nvml_library = r.str(), has_cuda_visible_devices = r.u32(), cuda_visible_devices = r.str();
    if (r.left() == 0) return;
    workdir = r.str(), program = r.str();
  }
};

struct Pause {  // the launcher is about to be stopped (Ctrl-Z): expect no heartbeat until its next frame
  static constexpr Type kType = Type::pause;
  bool operator==(const Pause&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};

struct TelemetryStart {  // sample every interval_ms (0: stop) while this host's ranks run
  static constexpr Type kType = Type::telemetry_start;
  bool operator==(const TelemetryStart&) const = default;
  uint32_t interval_ms = 0;
  std::string nvml_library;  // the job's MLTRAIN_NVML_LIBRARY ("": the agent's own, else the default)
  // 1: `mltrain top` on this host: sample with no ranks of its own, and find the host's mltrain
  // ranks (their comm counter blocks, GPU processes whose environment has RANK)
  uint32_t watch = 0;
  void put(Writer& w) const { w.u32(interval_ms).str(nvml_library).u32(watch); }
  void get(Reader& r) { interval_ms = r.u32(), nvml_library = r.str(), watch = r.u32(); }
};

// Sync (runner/agent/sync.cpp). The launcher sends the whole manifest of the tree (in frames of at
// most kSyncEntriesPerFrame entries, the last with `last`); the agent compares it with what the
// folder holds, removes what an earlier sync put there and the manifest no longer has, makes the
// directories and symlinks, fixes modes and times, and answers SyncWant with the files whose
// content it lacks. Their bytes follow as SyncData (id = the entry's index), each file written to a
// temporary name and renamed when whole; SyncEnd asks for SyncDone. The agent says how many raw
// bytes of SyncData it has handled (SyncWritten) every kSyncWrittenEvery, and the launcher keeps at
// most kSyncAhead raw bytes beyond that on their way: a compressible file (zeros compress 10,000
// to 1) must not queue gigabytes of decompressing and writing ahead of a heartbeat's answer.
inline constexpr size_t kSyncEntriesPerFrame = 4096;
inline constexpr size_t kSyncChunk = 256u << 10;  // raw bytes per SyncData frame, at most
inline constexpr uint64_t kSyncWrittenEvery = 4u << 20;
inline constexpr uint64_t kSyncAhead = 32u << 20;
struct SyncManifest {
  static constexpr Type kType = Type::sync_manifest;
  bool operator==(const SyncManifest&) const = default;
  std::string dir;  // the folder on the host ("~/" is the agent's home)
  std::vector<SyncEntry> entries;
  uint32_t last = 1;
  // The run syncing, as a key that sorts runs by when they started (lease::order_key: its
  // launcher's clock, then its id): a folder an earlier run uses while it runs is left alone, and
  // this run syncs into one of its own beside it (dir@2, dir@3, ...; SyncWant.copy says which).
  std::string run_key;
  void put(Writer& w) const {
    w.str(dir).u32(uint32_t(entries.size()));
    for (const auto& e : entries) e.put(w);
    w.u32(last);
    w.str(run_key);
  }
  void get(Reader& r) {
    dir = r.str();
    uint32_t n = r.u32();
    if (n > r.left() / 36) {  // each entry takes at least 36 bytes
      r.fail();
      return;
    }
    entries.resize(n);
    for (auto& e : entries) e.get(r);
    last = r.u32();
    if (r.left() > 0) run_key = r.str();
  }
};
struct SyncData {  // id = the entry's index; flags 1: the bytes are one zstd frame of raw_size bytes
  static constexpr Type kType = Type::sync_data;
  bool operator==(const SyncData&) const = default;
  uint64_t offset = 0;
  uint32_t raw_size = 0;
  uint16_t compressed = 0;
  std::string bytes;
  void put(Writer& w) const { w.u64(offset).u32(raw_size).raw(bytes); }
  void get(Reader& r) { offset = r.u64(), raw_size = r.u32(), bytes = r.rest(); }
};
struct SyncEnd {
  static constexpr Type kType = Type::sync_end;
  bool operator==(const SyncEnd&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};
// Runs `command` (/bin/sh -c) in `cwd` once, unless the last success on this host had the same
// `key` (and `force` is 0). Its output comes as Output frames with id kSetupId, then SetupDone.
struct Setup {
  static constexpr Type kType = Type::setup;
  bool operator==(const Setup&) const = default;
  std::string cwd, command;
  std::vector<std::string> env;  // "K=V", over the agent's own
  std::string key;               // what the setup depends on (command, synced tree)
  uint32_t force = 0;
  void put(Writer& w) const { w.str(cwd).str(command).strings(env).str(key).u32(force); }
  void get(Reader& r) { cwd = r.str(), command = r.str(), env = r.strings(), key = r.str(), force = r.u32(); }
};
// Sends back the files under `dir` that match `patterns` (runner/tree/ignore.h's syntax): one
// PullFile each, its bytes as PullData (id = its number), then PullDone.
struct Pull {
  static constexpr Type kType = Type::pull;
  bool operator==(const Pull&) const = default;
  std::string dir;
  std::vector<std::string> patterns;
  uint64_t max_bytes = 0;  // stop past this many bytes (0: no limit)
  void put(Writer& w) const { w.str(dir).strings(patterns).u64(max_bytes); }
  void get(Reader& r) { dir = r.str(), patterns = r.strings(), max_bytes = r.u64(); }
};

// The job's claim on the host (runner/lease/claim.h), made once preflight passed on every host and
// again while the job waits: `gpus` of the usable GPUs Prepare found (or `pinned_gpus` exactly),
// none a process computes on; the host alone when `exclusive`; a place in the host's queue when
// `order_key` is not empty. `claim_info` ("key=value") says who the job is to whoever looks;
// `lease_space` is where the leases live ("" the default).
struct Claim {
  static constexpr Type kType = Type::claim;
  bool operator==(const Claim&) const = default;
  std::string run_id, order_key, lease_space;
  uint32_t gpus = 0, exclusive = 0;
  std::vector<int32_t> pinned_gpus;
  std::vector<std::string> claim_info;
  void put(Writer& w) const {
    w.str(run_id)
        .str(order_key)
        .str(lease_space)
        .u32(gpus)
        .u32(exclusive)
        .ints(pinned_gpus)
        .strings(claim_info);
  }
  void get(Reader& r) {
    run_id = r.str(), order_key = r.str(), lease_space = r.str(), gpus = r.u32(), exclusive = r.u32();
    pinned_gpus = r.ints(), claim_info = r.strings();
  }
};

// Gives back what the host granted the job's claim (another host did not grant its part, and the
// job waits for all of them together), keeping its place in the queue.
struct Unclaim {
  static constexpr Type kType = Type::unclaim;
  bool operator==(const Unclaim&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};

// `mltrain queue`: every lease on the host (all users'), its GPUs and how busy they are. The
// agent asks NVML from `nvml_library` ("" its own search), and the holders within its own bound.
struct LeaseQuery {
  static constexpr Type kType = Type::lease_query;
  bool operator==(const LeaseQuery&) const = default;
  std::string lease_space, nvml_library;
  void put(Writer& w) const { w.str(lease_space).str(nvml_library); }
  void get(Reader& r) { lease_space = r.str(), nvml_library = r.str(); }
};

// `mltrain gc --hosts`: the synced folders in ~/.cache/mltrain/work that no run uses and none
// synced for `older_than_s` are removed (listed only, with `dry_run`).
struct GcWork {
  static constexpr Type kType = Type::gc_work;
  bool operator==(const GcWork&) const = default;
  uint64_t older_than_s = 0;
  uint32_t dry_run = 0;
  void put(Writer& w) const { w.u64(older_than_s).u32(dry_run); }
  void get(Reader& r) { older_than_s = r.u64(), dry_run = r.u32(); }
};

// agent -> launcher
struct SyncWant {
  static constexpr Type kType = Type::sync_want;
  bool operator==(const SyncWant&) const = default;
  std::string dir;            // the folder, absolute
  std::vector<int32_t> want;  // the entries whose bytes to send
  uint32_t deleted = 0;       // paths removed
  std::vector<std::string> problems;
  // 0: the folder asked for; N: it was in use by another run, so this one is "<dir>@N" (dir is it).
  uint32_t copy = 0;
  void put(Writer& w) const { w.str(dir).ints(want).u32(deleted).strings(problems).u32(copy); }
  void get(Reader& r) {
    dir = r.str(), want = r.ints(), deleted = r.u32(), problems = r.strings();
    if (r.left() > 0) copy = r.u32();
  }
};
struct SyncDone {
  static constexpr Type kType = Type::sync_done;
  bool operator==(const SyncDone&) const = default;
  uint32_t files = 0;  // written
  uint64_t bytes = 0;
  std::vector<std::string> problems;
  void put(Writer& w) const { w.u32(files).u64(bytes).strings(problems); }
  void get(Reader& r) { files = r.u32(), bytes = r.u64(), problems = r.strings(); }
};
struct SyncWritten {
  static constexpr Type kType = Type::sync_written;
  bool operator==(const SyncWritten&) const = default;
  uint64_t bytes = 0;  // raw bytes of SyncData handled (written, or refused) since the manifest
  void put(Writer& w) const { w.u64(bytes); }
  void get(Reader& r) { bytes = r.u64(); }
};
struct SetupDone {
  static constexpr Type kType = Type::setup_done;
  bool operator==(const SetupDone&) const = default;
  uint32_t ran = 0;     // 0: its last success had the same key
  int32_t status = 0;   // as waitpid gives it
  std::string message;  // why it could not start
  void put(Writer& w) const { w.u32(ran).i32(status).str(message); }
  void get(Reader& r) { ran = r.u32(), status = r.i32(), message = r.str(); }
};
struct PullFile {  // id = the file's number
  static constexpr Type kType = Type::pull_file;
  bool operator==(const PullFile&) const = default;
  std::string path;  // relative to the Pull's dir
  uint32_t mode = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  void put(Writer& w) const { w.str(path).u32(mode).u64(size).u64(uint64_t(mtime_ns)); }
  void get(Reader& r) { path = r.str(), mode = r.u32(), size = r.u64(), mtime_ns = int64_t(r.u64()); }
};
struct PullData {  // id = the file's number; the bytes follow its PullFile in order
  static constexpr Type kType = Type::pull_data;
  bool operator==(const PullData&) const = default;
  std::string bytes;
  void put(Writer& w) const { w.raw(bytes); }
  void get(Reader& r) { bytes = r.rest(); }
};
struct PullDone {
  static constexpr Type kType = Type::pull_done;
  bool operator==(const PullDone&) const = default;
  uint32_t files = 0;
  uint64_t bytes = 0;
  std::vector<std::string> problems;  // unreadable files, the size limit
  uint32_t single_file = 0;           // 1: the Pull's dir was a file, sent under its own name
  void put(Writer& w) const { w.u32(files).u64(bytes).strings(problems).u32(single_file); }
  void get(Reader& r) {
    files = r.u32(), bytes = r.u64(), problems = r.strings();
    if (r.left() > 0) single_file = r.u32();
  }
};

// agent -> launcher
struct HelloAck {
  static constexpr Type kType = Type::hello_ack;
  bool operator==(const HelloAck&) const = default;
  uint32_t magic = kMagic, version = kVersion;
  int32_t pid = 0;
  std::string hostname, arch;
  void put(Writer& w) const { w.u32(magic).u32(version).i32(pid).str(hostname).str(arch); }
  void get(Reader& r) {
    magic = r.u32(), version = r.u32(), pid = r.i32(), hostname = r.str(), arch = r.str();
  }
};
struct Started {  // id = rank
  static constexpr Type kType = Type::started;
  bool operator==(const Started&) const = default;
  int32_t pid = 0;
  void put(Writer& w) const { w.i32(pid); }
  void get(Reader& r) { pid = r.i32(); }
};
struct SpawnFailed {  // id = rank
  static constexpr Type kType = Type::spawn_failed;
  bool operator==(const SpawnFailed&) const = default;
  std::string message;
  void put(Writer& w) const { w.str(message); }
  void get(Reader& r) { message = r.str(); }
};
struct Output {  // id = rank; the frame's flags carry the stream; the payload is the raw bytes
  static constexpr Type kType = Type::output;
  bool operator==(const Output&) const = default;
  uint16_t stream = 1;  // 1 stdout, 2 stderr
  std::string bytes;
  void put(Writer& w) const { w.raw(bytes); }
  void get(Reader& r) { bytes = r.rest(); }
};
struct Exited {  // id = rank
  static constexpr Type kType = Type::exited;
  bool operator==(const Exited&) const = default;
  int32_t status = 0;       // as waitpid gives it
  std::string error_file;   // what a failed rank wrote to its TORCHELASTIC_ERROR_FILE (capped), or ""
  uint32_t oom_killed = 0;  // 1: the kernel recorded killing it for memory (runner/agent/oom.h)
  void put(Writer& w) const { w.i32(status).str(error_file).u32(oom_killed); }
  void get(Reader& r) {
    status = r.i32(), error_file = r.str();
    if (r.left() > 0) oom_killed = r.u32();
  }
};
struct Pong {
  static constexpr Type kType = Type::pong;
  bool operator==(const Pong&) const = default;
  uint64_t seq = 0;
  void put(Writer& w) const { w.u64(seq); }
  void get(Reader& r) { seq = r.u64(); }
};
struct AgentError {  // something the agent could not do
  static constexpr Type kType = Type::error;
  bool operator==(const AgentError&) const = default;
  std::string message;
  void put(Writer& w) const { w.str(message); }
  void get(Reader& r) { message = r.str(); }
};
struct LauncherSilent {  // no frame from the launcher for silent_ms: the agent stops its ranks now
  static constexpr Type kType = Type::launcher_silent;
  bool operator==(const LauncherSilent&) const = default;
  uint32_t silent_ms = 0;
  void put(Writer& w) const { w.u32(silent_ms); }
  void get(Reader& r) { silent_ms = r.u32(); }
};
struct Bye {  // the agent is exiting after shutdown
  static constexpr Type kType = Type::bye;
  bool operator==(const Bye&) const = default;
  void put(Writer&) const {}
  void get(Reader&) {}
};
// The answer to Claim: granted (`gpus`: the job's GPUs, leased, in the order the ranks get them),
// busy (in the way: one entry per obstacle, "key=value" lines as runner/lease/lease.h encodes
// them: what, uid, pid, and what its holder says; `ahead`: jobs queued before this one), or failed
// (`error`).
enum class ClaimState : uint32_t { granted = 1, busy = 2, failed = 3 };
struct Claimed {
  static constexpr Type kType = Type::claimed;
  bool operator==(const Claimed&) const = default;
  uint32_t state = 0;  // ClaimState
  std::vector<int32_t> gpus;
  uint32_t ahead = 0;
  std::vector<std::string> in_the_way;
  std::string error;
  // Holders of the names asked about that proved nothing (lease::Seen::doubt) and were ignored:
  // "key=value" lines as in_the_way's, with `doubt` and `name`.
  std::vector<std::string> squatters;
  void put(Writer& w) const {
    w.u32(state).ints(gpus).u32(ahead).strings(in_the_way).str(error).strings(squatters);
  }
  void get(Reader& r) {
    state = r.u32(), gpus = r.ints(), ahead = r.u32(), in_the_way = r.strings(), error = r.str();
    if (r.left() > 0) squatters = r.strings();  // from an agent that names none
  }
};

// The answer to LeaseQuery: one entry per lease ("key=value" lines, runner/lease/lease.h's
// encoding: name, uid, pid, account (the uid's name on the host), answered, and what the holder
// says of itself), the host's GPUs, each one's utilization (-1: unknown) and whether a process
// computes on it, and why the GPUs are unknown when they are.
struct LeaseList {
  static constexpr Type kType = Type::lease_list;
  bool operator==(const LeaseList&) const = default;
  std::vector<std::string> leases;
  std::vector<Gpu> gpus;
  std::vector<int32_t> util_percent, busy;
  std::string gpu_note;
  void put(Writer& w) const {
    w.strings(leases);
    put_gpus(w, gpus);
    w.ints(util_percent).ints(busy).str(gpu_note);
  }
  void get(Reader& r) {
    leases = r.strings();
    gpus = get_gpus(r);
    util_percent = r.ints(), busy = r.ints(), gpu_note = r.str();
  }
};

// The answer to GcWork: one entry per folder ("key=value" lines: name, state (removed,
// would_remove, in_use, recent, failed), bytes, age_s, run (who uses it)), and what went wrong.
struct GcDone {
  static constexpr Type kType = Type::gc_done;
  bool operator==(const GcDone&) const = default;
  std::vector<std::string> folders, problems;
  void put(Writer& w) const { w.strings(folders).strings(problems); }
  void get(Reader& r) { folders = r.strings(), problems = r.strings(); }
};

struct Prepared {
  static constexpr Type kType = Type::prepared;
  bool operator==(const Prepared&) const = default;
  std::string ifname;    // the interface routing to master_addr
  std::string local_ip;  // this host's address on that route
  std::vector<std::string> ports, problems;
  uint32_t cannot_start = 0;  // 1: the program or the workdir is missing here (exit 127)
  // GPUs, when Prepare asked for some: every GPU found, the physical indices the ranks may use
  // (in CUDA_VISIBLE_DEVICES order), how they were found ("nvml", "nvidia-smi" or ""), why none
  // or what failed, and the CUDA_VISIBLE_DEVICES that restricted them (when one applied).
  std::vector<Gpu> gpus;
  std::vector<int32_t> gpu_usable;
  std::string gpu_source, gpu_note;
  uint32_t has_cuda_visible_devices = 0;
  std::string cuda_visible_devices;
  std::vector<int32_t> ps_ports;  // where the PS servers Prepare asked for listen, in its order
  // When Prepare asked: "key=value" — os, kernel, arch, glibc, cpus, gpus, gpu_driver, cuda, nccl,
  // python, torch, mltrain (runner/agent/host_facts.cpp).
  std::vector<std::string> facts;
  void put(Writer& w) const {
    w.str(ifname).str(local_ip).strings(ports).strings(problems).u32(cannot_start);
    put_gpus(w, gpus);
    w.ints(gpu_usable).str(gpu_source).str(gpu_note).u32(has_cuda_visible_devices).str(cuda_visible_devices);
    w.ints(ps_ports);
    w.strings(facts);
  }
  void get(Reader& r) {
    ifname = r.str(), local_ip = r.str(), ports = r.strings(), problems = r.strings();
    cannot_start = r.u32();
    if (r.left() == 0) return;  // from an agent without GPU fields
    gpus = get_gpus(r);
    gpu_usable = r.ints(), gpu_source = r.str(), gpu_note = r.str(), has_cuda_visible_devices = r.u32();
    cuda_visible_devices = r.str();
    if (r.left() > 0) ps_ports = r.ints();
    if (r.left() > 0) facts = r.strings();
  }
};
struct Probed {
  static constexpr Type kType = Type::probed;
  bool operator==(const Probed&) const = default;
  // "key=value": arch, kernel, glibc, gpus, gpu_source, gpu_driver, gpu_note, gpus_usable,
  // cuda_visible_devices, nccl, python, python_from, python_missing, python3, torch, time_ms,
  // port_free
  std::vector<std::string> facts;
  std::vector<Gpu> gpus;  // the host's GPUs
  void put(Writer& w) const {
    w.strings(facts);
    put_gpus(w, gpus);
  }
  void get(Reader& r) {
    facts = r.strings();
    if (r.left() > 0) gpus = get_gpus(r);
  }
};

struct Telemetry {  // one sample of the host, its GPUs and ranks (runner/telemetry/sample.h's text)
  static constexpr Type kType = Type::telemetry;
  bool operator==(const Telemetry&) const = default;
  std::string sample;
  void put(Writer& w) const { w.str(sample); }
  void get(Reader& r) { sample = r.str(); }
};

// A line of a PS server's log; failed = 1: the server stopped serving (the line says why).
struct PsLog {
  static constexpr Type kType = Type::ps_log;
  bool operator==(const PsLog&) const = default;
  int32_t server = 0;
  uint32_t failed = 0;
  std::string line;
  void put(Writer& w) const { w.i32(server).u32(failed).str(line); }
  void get(Reader& r) { server = r.i32(), failed = r.u32(), line = r.str(); }
};
// The counters of this host's PS servers: with each telemetry sample, and before Bye.
struct PsServerCounters {
  bool operator==(const PsServerCounters&) const = default;
  int32_t server = 0, port = 0;
  uint64_t bytes_in = 0, bytes_out = 0, requests = 0, keys = 0;
  uint32_t workers = 0, queue_depth = 0, max_queue_depth = 0;
};
struct PsStats {
  static constexpr Type kType = Type::ps_stats;
  bool operator==(const PsStats&) const = default;
  std::vector<PsServerCounters> servers;
  void put(Writer& w) const {
    w.u32(uint32_t(servers.size()));
    for (const auto& s : servers) {
      w.i32(s.server).i32(s.port).u64(s.bytes_in).u64(s.bytes_out).u64(s.requests).u64(s.keys);
      w.u32(s.workers).u32(s.queue_depth).u32(s.max_queue_depth);
    }
  }
  void get(Reader& r) {
    uint32_t n = r.u32();
    for (uint32_t i = 0; i < n && !r.failed() && r.left() > 0; ++i) {
      PsServerCounters s;
      s.server = r.i32(), s.port = r.i32(), s.bytes_in = r.u64(), s.bytes_out = r.u64(), s.requests = r.u64();
      s.keys = r.u64(), s.workers = r.u32(), s.queue_depth = r.u32(), s.max_queue_depth = r.u32();
      servers.push_back(s);
    }
  }
};

}  // namespace msg

using Message =
    std::variant<msg::Hello, msg::Spawn, msg::Signal, msg::Terminate, msg::Ping, msg::Shutdown, msg::Prepare,
                 msg::Probe, msg::Stdin, msg::StdinClose, msg::Pause, msg::HelloAck, msg::Started,
                 msg::SpawnFailed, msg::Output, msg::Exited, msg::Pong, msg::AgentError, msg::LauncherSilent,
                 msg::Bye, msg::Prepared, msg::Probed, msg::TelemetryStart, msg::Telemetry, msg::SyncManifest,
                 msg::SyncData, msg::SyncEnd, msg::Setup, msg::Pull, msg::SyncWant, msg::SyncDone,
                 msg::SetupDone, msg::PullFile, msg::PullData, msg::PullDone, msg::PsLog, msg::PsStats,
                 msg::Claim, msg::Unclaim, msg::Claimed, msg::LeaseQuery, msg::LeaseList, msg::GcWork,
                 msg::GcDone, msg::SyncWritten>;

// Appends message `m` as one frame with `id` (a rank, kAllRanks, or 0).
template <class M>
void encode(std::string& out, const M& m, uint32_t id = 0) {
  Writer w;
  m.put(w);
  uint16_t flags = 0;
  if constexpr (std::is_same_v<M, msg::Output>) flags = m.stream;
  if constexpr (std::is_same_v<M, msg::SyncData>) flags = m.compressed;
  encode(out, M::kType, id, w.take(), flags);
}

// The frame's message, or nullopt with `error` saying what was wrong (unknown type, short payload).
// Takes the payload by move: output frames are the hot path.
std::optional<Message> decode(Frame&& f, std::string& error);

}  // namespace mltrain::agent
