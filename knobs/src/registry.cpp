#include "knobs/registry.h"

#include <cstdlib>
#include <string>

#include "knobs/parse.h"

namespace mltrain::knobs {

namespace {

// Every variable mltrain reads, once. tests/unit/test_knobs.cpp scans the sources for reads of
// names missing here.
const Knob kKnobs[] = {
    // The launcher.
    {"MLTRAIN_HOME",
     Kind::string,
     "",
     "where run records and the agent cache live",
     launcher,
     {},
     "$XDG_STATE_HOME/mltrain"},
    {"MLTRAIN_LOG", Kind::choice, "warn", "diagnostics on stderr (-v and -vv raise it)", launcher,
     "debug|info|warn|error|off"},
    {"MLTRAIN_SECRET_VARS",
     Kind::string,
     "",
     "more variable names (comma-separated globs) shown as <secret> in records and printouts, "
     "besides *_KEY, *TOKEN*, *SECRET*, *PASSWORD*",
     launcher,
     {},
     "(none)"},
    {"MLTRAIN_TELEMETRY_INTERVAL", Kind::duration, "1s",
     "how often each host's agent samples CPU, memory, GPUs and its ranks (with their time in "
     "collectives) into the run's telemetry.jsonl (0: no telemetry)",
     launcher},
    {"MLTRAIN_LOCAL_AGENT_WRAPPER",
     Kind::string,
     "",
     "a program (with its words, split at spaces) that the local agent runs under, the agent's path "
     "last: valgrind, strace, or the tests' hostile-agent stand-in",
     launcher,
     {},
     "(none)"},
    {"MLTRAIN_SYNC_WARN_BYTES", Kind::bytes, "100M",
     "a synced file at least this big that travels is named once, with a hint to leave it out", launcher},
    {"MLTRAIN_PULL_MAX_BYTES", Kind::bytes, "64G",
     "the most bytes a pull ([sync] pull, mltrain cp) writes from one host; past it the rest "
     "is left behind and named (a pull also stops while the destination has under 1 GiB free)",
     launcher},
    {"MLTRAIN_PULL_STALL_TIMEOUT", Kind::duration, "60s",
     "a pull ([sync] pull, mltrain cp) from a host that sends nothing for this long, though it "
     "answers heartbeats, ends with what came",
     launcher},
    {"MLTRAIN_HEARTBEAT_INTERVAL", Kind::duration, "2s",
     "how often the launcher pings each remote host's agent (a host answers every ping)", launcher},
    {"MLTRAIN_HEARTBEAT_TIMEOUT", Kind::duration, "10s",
     "a remote host silent this long is lost (its ranks count as failed); the launcher sends it "
     "to every agent, which stops its ranks after as long without a word from the launcher; "
     "more than MLTRAIN_HEARTBEAT_INTERVAL",
     launcher},
    {"XDG_STATE_HOME", Kind::string, "", "base of MLTRAIN_HOME's default", launcher, {}, "~/.local/state"},
    {"XDG_CONFIG_HOME",
     Kind::string,
     "",
     "user profiles are read from $XDG_CONFIG_HOME/mltrain/profiles/NAME.toml",
     launcher,
     {},
     "~/.config"},
    {"HOME",
     Kind::string,
     "",
     "home folder: ~/.ssh/config and the defaults above",
     launcher,
     {},
     "(from the system)"},
    {"NO_COLOR",
     Kind::string,
     "",
     "set to anything to turn off coloured rank prefixes",
     launcher,
     {},
     "(unset)"},
    {"TERM",
     Kind::string,
     "",
     "TERM=dumb turns off coloured rank prefixes",
     launcher,
     {},
     "(from the terminal)"},
    {"COLUMNS",
     Kind::string,
     "",
     "width that `mltrain knobs` wraps its MEANING column to (a pipe is not wrapped)",
     launcher,
     {},
     "(the terminal's)"},
    {"SLURM_JOB_NODELIST",
     Kind::string,
     "",
     "inside a Slurm allocation with no hosts given, the hosts to use",
     launcher,
     {},
     "(unset)"},
    {"SLURM_TASKS_PER_NODE",
     Kind::string,
     "",
     "inside a Slurm allocation with no hosts given, each node's slots (\"2(x3),1\")",
     launcher,
     {},
     "(unset)"},
    {"SLURM_JOB_ID",
     Kind::string,
     "",
     "set: inside a Slurm allocation, where [cluster] launcher = \"auto\" starts agents with srun "
     "(docs/slurm.md); "
     "recorded with the run",
     launcher,
     {},
     "(unset)"},
    {"PATH", Kind::string, "/usr/bin:/bin",
     "where a rank's program is looked up when the job's env sets no PATH", agent},
    {"TMPDIR", Kind::string, "/tmp",
     "where a host's agent makes its private folder for the run (0700; remote ranks' "
     "TORCHELASTIC_ERROR_FILE)",
     agent},
    // The comm library (workers; `mltrain bench` ranks too).
    {"RANK", Kind::integer, "0", "this process's rank", comm},
    {"WORLD_SIZE", Kind::integer, "1", "number of ranks (1 needs no store)", comm},
    {"LOCAL_RANK", Kind::integer, "0",
     "this process's rank on its host (mltrain-comm-bench --device uses GPU LOCAL_RANK % visible GPUs)",
     comm},
    {"MASTER_ADDR", Kind::string, "127.0.0.1",
     "store host when MLTRAIN_STORE_ADDR is unset (the launcher sets both)", comm},
    {"MASTER_PORT", Kind::integer, "29500",
     "the store listens on MASTER_PORT+1 when "
     "MLTRAIN_STORE_ADDR is unset",
     comm},
    {"MLTRAIN_STORE_ADDR",
     Kind::string,
     "",
     "host:port of the store rank 0 hosts",
     comm,
     {},
     "$MASTER_ADDR:$MASTER_PORT+1"},
    {"MLTRAIN_TOKEN",
     Kind::string,
     "",
     "the job's secret; every store connection must prove it",
     comm,
     {},
     "(empty)"},
    {"TORCHELASTIC_RESTART_COUNT", Kind::integer, "0",
     "the gang's restart count (the launcher sets it); PS servers start afresh for a new one", comm},
    {"MLTRAIN_PS_SERVERS",
     Kind::string,
     "",
     "PS mode: where the job's parameter servers listen, host=addr:port,... (the launcher sets it "
     "from [ps])",
     comm,
     {},
     "(empty)"},
    {"MLTRAIN_PS_PARTITION_BYTES", Kind::bytes, "4M",
     "PS mode: a key larger than this is split into parts spread over the servers (from [ps] "
     "partition_bytes)",
     comm},
    {"MLTRAIN_PS_SYNC", Kind::flag, "1",
     "PS mode: whether the servers sum rounds (1) or apply each push at once (0); from [ps] sync", comm},
    {"MLTRAIN_PS_MEMORY", Kind::string, "50%",
     "PS mode: what each host's parameter servers may hold together, a size (8G) or a share of the "
     "host's memory (the smaller of MemTotal and the agent's cgroup limit); a declare or push past it "
     "is refused naming the key and the worker (the job's env, else the launcher's)",
     launcher},
    {"MLTRAIN_RUN_ID",
     Kind::string,
     "",
     "the job's run id (the launcher sets it); names the job's /dev/shm segments, so its agent "
     "removes them when the job ends",
     comm,
     {},
     "(empty)"},
    {"MLTRAIN_COMM_TIMEOUT", Kind::duration, "300s",
     "how long any call may go without progress before it fails naming the peer (bare number: "
     "seconds)",
     comm},
    {"MLTRAIN_COMM_TRANSPORT", Kind::choice, "auto",
     "auto: shared memory between ranks that share a kernel (boot id) and /dev/shm, TCP otherwise", comm,
     "auto|tcp|shm"},
    {"MLTRAIN_COMM_DEBUG", Kind::flag, "0",
     "print on stderr which transport (shm or tcp) each link uses, and why", comm},
    {"MLTRAIN_COMM_STATS", Kind::flag, "1",
     "keep per-rank time-in-collective counters in /dev/shm for mltrain top (0: off)", comm},
    {"MLTRAIN_COMM_STATS_NAME",
     Kind::string,
     "",
     "the /dev/shm name of this rank's counter block (unset: /mltrain-RUN_ID-stats-RANK); the agent "
     "sets an unguessable one per rank",
     comm,
     {},
     "(per rank)"},
    {"MLTRAIN_COMM_SHM_BYTES", Kind::bytes, "1M",
     "shared-memory ring capacity per direction per pair of ranks, and the direct allreduce's "
     "staging slot (two per rank)",
     comm},
    {"MLTRAIN_COMM_CHUNK_BYTES", Kind::bytes, "256K", "pipeline piece (TCP links: twice that, at least 512K)",
     comm},
    {"MLTRAIN_COMM_SMALL_BYTES", Kind::bytes, "64K",
     "allreduce at or below this size uses recursive doubling (power-of-two worlds)", comm},
    {"MLTRAIN_COMM_SPIN_US", Kind::integer, "50",
     "microseconds a waiting rank spins (yielding) before it sleeps", comm},
    {"MLTRAIN_COMM_TCP_CC", Kind::string, "auto",
     "congestion control of the TCP links between ranks: auto (the host's, except bbr, which without "
     "the fq qdisc paces every packet with a kernel timer: then cubic or reno, whichever the host "
     "allows), system (the host's), or an algorithm the host allows",
     comm},
    {"MLTRAIN_COMM_ALGO", Kind::choice, "auto",
     "large allreduce (auto: direct when every rank shares one host; across hosts hd on "
     "power-of-two worlds, else bidir); every rank must use the same",
     comm, "auto|ring|bidir|hd|direct"},
    {"MLTRAIN_COMM_BACKEND", Kind::choice, "auto",
     "auto: NCCL for device buffers when every rank has its own GPU and NCCL loads on every host, "
     "else the CPU backend (tcp: shared memory and TCP); every rank resolves it the same way",
     comm, "auto|tcp|nccl"},
    {"MLTRAIN_NCCL_LIBRARY",
     Kind::string,
     "",
     "the NCCL library to dlopen (a path, or a name the loader looks up); unset: the loader path, "
     "/usr/local/cuda/lib{64,}, then the job's Python's nvidia/*/lib wheels (docs/gpu.md)",
     comm,
     {},
     "libnccl.so.2"},
    {"MLTRAIN_CUDART_LIBRARY",
     Kind::string,
     "",
     "the CUDA runtime library to dlopen (a path, or a name the loader looks up); unset: .13 then .12 "
     "in the loader path, /usr/local/cuda/lib{64,}, then the job's Python's nvidia/*/lib wheels",
     comm,
     {},
     "libcudart.so.13"},
    {"MLTRAIN_NVML_LIBRARY",
     Kind::string,
     "",
     "the NVML library the agent dlopens to list a host's GPUs (a path, or a name the loader looks up); "
     "unset: the loader path, /usr/local/nvidia/lib{64,}, the Python wheels; else nvidia-smi -L",
     agent,
     {},
     "libnvidia-ml.so.1"},
    {"CUDA_VISIBLE_DEVICES",
     Kind::string,
     "",
     "GPUs a host's ranks may use (indices or GPU- UUID prefixes, as CUDA reads them); [gpus] gives each "
     "rank its own among them",
     agent,
     {},
     "(unset: all)"},
    {"MLTRAIN_COMM_HOST",
     Kind::string,
     "",
     "host name in messages; when set, ranks with different values never share memory",
     comm,
     {},
     "gethostname()"},
};

const Knob& declared(std::string_view name) {
  if (const Knob* k = find(name)) return *k;
  throw std::logic_error("environment variable " + std::string(name) +
                         " is read but not declared in knobs/src/registry.cpp");
}

std::string_view raw(const Knob& k) {
  const std::string name(k.name);
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return k.default_value;
  return value;
}

[[noreturn]] void bad(const Knob& k, std::string_view text, const std::string& expected) {
  throw BadValue(std::string(k.name) + "='" + std::string(text) + "' " + expected);
}

}  // namespace

std::span<const Knob> all() { return kKnobs; }

const Knob* find(std::string_view name) {
  for (const Knob& k : kKnobs)
    if (k.name == name) return &k;
  return nullptr;
}

std::string readers_text(unsigned readers) {
  std::string out;
  for (auto [bit, word] : {std::pair{launcher, "launcher"}, {comm, "comm"}, {agent, "agent"}})
    if (readers & bit) out += (out.empty() ? "" : ",") + std::string(word);
  return out;
}

std::string kind_text(const Knob& k) {
  switch (k.kind) {
    case Kind::duration:
      return "duration";
    case Kind::integer:
      return "integer";
    case Kind::bytes:
      return "bytes";
    case Kind::choice:
      return std::string(k.choices);
    case Kind::string:
      return "string";
    case Kind::flag:
      return "flag";
  }
  return "?";
}

std::chrono::milliseconds duration_value(const Knob& k, std::string_view text) {
  if (auto d = parse_duration(text)) return *d;
  bad(k, text, "is not a duration (write it like 90s, 5m, 1h30m; a bare number is seconds)");
}

std::int64_t int_value(const Knob& k, std::string_view text) {
  if (auto v = parse_int(text)) return *v;
  bad(k, text, "is not an integer");
}

std::uint64_t bytes_value(const Knob& k, std::string_view text) {
  if (auto v = parse_bytes(text)) return *v;
  bad(k, text, "is not a size (write it like 4096, 64K, 1M, 2G)");
}

bool flag_value(const Knob& k, std::string_view text) {
  if (auto v = parse_flag(text)) return *v;
  bad(k, text, "is not a flag (write 1 or 0, true or false)");
}

std::string choice_value(const Knob& k, std::string_view text) {
  std::string_view rest = k.choices;
  while (!rest.empty()) {
    const size_t bar = rest.find('|');
    const std::string_view choice = rest.substr(0, bar);
    if (choice == text) return std::string(choice);
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  // "a|b|c" reads "a, b or c".
  std::string expected(k.choices);
  const size_t last = expected.rfind('|');
  if (last != std::string::npos) expected.replace(last, 1, " or ");
  for (auto& c : expected)
    if (c == '|') c = ',';
  size_t comma = 0;
  while ((comma = expected.find(',', comma)) != std::string::npos) expected.insert(++comma, " ");
  bad(k, text, "(expected " + expected + ")");
}

std::string get_string(std::string_view name) { return std::string(raw(declared(name))); }

bool is_set(std::string_view name) {
  const Knob& k = declared(name);
  const char* value = std::getenv(std::string(k.name).c_str());
  return value != nullptr && *value != '\0';
}

std::optional<std::string> get_raw(std::string_view name) {
  const Knob& k = declared(name);
  const char* value = std::getenv(std::string(k.name).c_str());
  return value ? std::optional<std::string>(value) : std::nullopt;
}

std::chrono::milliseconds get_duration(std::string_view name) {
  const Knob& k = declared(name);
  return duration_value(k, raw(k));
}

std::int64_t get_int(std::string_view name) {
  const Knob& k = declared(name);
  return int_value(k, raw(k));
}

std::uint64_t get_bytes(std::string_view name) {
  const Knob& k = declared(name);
  return bytes_value(k, raw(k));
}

bool get_flag(std::string_view name) {
  const Knob& k = declared(name);
  return flag_value(k, raw(k));
}

std::string get_choice(std::string_view name) {
  const Knob& k = declared(name);
  return choice_value(k, raw(k));
}

}  // namespace mltrain::knobs
