// The checks of a whole spec after command-line overrides, the names it may hold, and the key list
// of docs/spec.md, all read from the schema (detail/schema.h).
#include <algorithm>
#include <cctype>
#include <cmath>

#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/spec/detail/schema.h"
#include "runner/spec/spec.h"

namespace mltrain::spec {
namespace {

// Variables mltrain sets for every rank; a spec's env may not set them (DESIGN.md, Contracts).
const std::vector<std::string> kReservedEnv = {"RANK",
                                               "WORLD_SIZE",
                                               "LOCAL_RANK",
                                               "LOCAL_WORLD_SIZE",
                                               "NODE_RANK",
                                               "GROUP_RANK",
                                               "MASTER_ADDR",
                                               "MASTER_PORT",
                                               "TORCHELASTIC_RESTART_COUNT",
                                               "TORCHELASTIC_MAX_RESTARTS",
                                               "TORCHELASTIC_RUN_ID",
                                               "MLTRAIN_RUN_ID",
                                               "MLTRAIN_STORE_ADDR",
                                               "MLTRAIN_TOKEN",
                                               "DMLC_ROLE",
                                               "DMLC_NUM_WORKER",
                                               "DMLC_NUM_SERVER",
                                               "DMLC_PS_ROOT_URI",
                                               "DMLC_PS_ROOT_PORT",
                                               "DMLC_WORKER_ID",
                                               "MLTRAIN_PS_SERVERS",
                                               "MLTRAIN_PS_SYNC",
                                               "MLTRAIN_PS_PARTITION_BYTES"};

bool valid_env_name(const std::string& k) {
  if (k.empty() || std::isdigit(static_cast<unsigned char>(k[0]))) return false;
  for (char c : k)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_')) return false;
  return true;
}

// Bounds past which a duration is a typo or an attack, and some would overflow a clock: the
// schema's, checked after the flags (which set durations too).
void check_durations(const JobSpec& s, const std::string& file) {
  for (const auto& k : detail::keys()) {
    if (k.type != detail::Type::duration || k.max_duration.count() == 0) continue;
    const Duration d = std::get<detail::Ref<Duration>>(k.member).read(s);
    if (d > k.max_duration)
      throw Error(s.origin(k.path(), file) + ": [" + std::string(k.section) + "] " + std::string(k.name) +
                      " " + text::format_duration(d) + " is longer than the " +
                      text::format_duration(k.max_duration) + " mltrain supports",
                  "give a shorter duration");
  }
}

void check_ps(const JobSpec& s, const std::string& file) {
  if (s.ps.present && s.comm.mode == "allreduce")  // [ps] in a profile, mode in the spec (or the reverse)
    throw Error(s.origin("comm.mode", file) + ": [comm] mode = \"allreduce\" contradicts the [ps] table at " +
                    s.origin("ps", file),
                "a [ps] table makes the job parameter-server mode: remove mode, or remove [ps] to train with "
                "allreduce");
  if (s.ps.servers_per_host > 0 && s.comm.num_servers > 0)
    throw Error(s.origin("ps.servers_per_host", file) + ": [ps] servers_per_host and [comm] num_servers (" +
                    s.origin("comm.num_servers", file) + ") cannot both be set",
                "servers_per_host runs that many servers on each server host; num_servers is a total spread "
                "over them: keep one");
  if (s.comm.mode == "ps" && s.ps.sync && !s.ps.optimizer.name.empty()) {
    std::string sync_at =
        s.origins.count("ps.sync") ? " (" + s.origin("ps.sync", file) + ")" : " (the default)";
    throw Error(s.origin("ps.optimizer", file) +
                    ": [ps.optimizer] is for asynchronous training, but [ps] sync is true" + sync_at,
                "set sync = false in [ps] (each push is then applied at once by the server's optimizer), or "
                "remove [ps.optimizer]: in sync mode the workers step their own optimizer");
  }
}

void check_gpus(const JobSpec& s, const std::string& file) {
  if (s.gpus.per_proc > 0 && s.gpus.procs_per_gpu > 0)
    throw Error(s.origin("gpus.per_proc", file) + ": [gpus] per_proc and procs_per_gpu cannot both be set",
                "per_proc gives each rank N GPUs; procs_per_gpu shares one GPU among N ranks");
  if (s.comm.backend == "nccl" && s.gpus.procs_per_gpu > 1)
    throw Error(
        s.origin("gpus.procs_per_gpu", file) +
            ": [gpus] procs_per_gpu = " + std::to_string(s.gpus.procs_per_gpu) +
            " shares a GPU between ranks, but [comm] backend = \"nccl\" (" + s.origin("comm.backend", file) +
            ") cannot: NCCL refuses two ranks of one communicator on one GPU (\"Duplicate GPU detected\")",
        "give each rank its own GPU (procs_per_gpu = 1, or per_proc), or set backend = \"auto\" or \"tcp\"");
}

// How docs/spec.md names a key's type and bounds.
std::string type_text(const detail::Key& k) {
  using detail::Type;
  auto number = [](double v) {
    std::string t = std::to_string(v);
    t.erase(t.find_last_not_of('0') + 1);
    if (t.back() == '.') t.pop_back();
    return t;
  };
  auto span = [](Duration d) {
    const auto h = std::chrono::duration_cast<std::chrono::hours>(d).count();
    return h >= 48 && h % 24 == 0 ? std::to_string(h / 24) + " days" : std::to_string(h) + " h";
  };
  switch (k.type) {
    case Type::section:
      return "table";
    case Type::string:
      return "string";
    case Type::path:
      return "path";
    case Type::integer:
      return "integer, " + std::to_string(k.lo) + " to " + std::to_string(k.hi);
    case Type::boolean:
      return "boolean";
    case Type::number:
      return "number" + (std::isinf(k.min) ? "" : (k.min_open ? ", > " : ", >= ") + number(k.min)) +
             (std::isinf(k.max) ? "" : (k.max_open ? ", < " : ", <= ") + number(k.max));
    case Type::duration:
      return k.max_duration.count() ? "duration, at most " + span(k.max_duration) : "duration";
    case Type::size:
      return "size, 1 byte to " + std::string(k.range_hint);
    case Type::strings:
      return "array of strings";
    case Type::choice:
      return "one of " + text::join(k.choices, ", ");
    case Type::env:
      return "table of variables";
    case Type::custom:
      return std::string(k.shown);
  }
  return {};
}

}  // namespace

// A job name made from a file name or a command the user typed: anything a name may not hold
// becomes '-' (once per run of them), so "my job.toml" is my-job and 'echo hi there' is echo.
std::string derived_name(const std::string& from) {
  std::string out;
  for (char c : from) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.';
    if (ok)
      out += c;
    else if (!out.empty() && out.back() != '-')
      out += '-';
  }
  while (!out.empty() && (out.back() == '-' || out.back() == '.')) out.pop_back();
  while (!out.empty() && out.front() == '.') out.erase(0, 1);
  if (out.size() > 64) out.resize(64);
  return out.empty() ? "job" : out;
}

const std::vector<std::string>& prefix_placeholders() {
  static const std::vector<std::string> kNames = {"rank", "host", "local_rank", "node"};
  return kNames;
}

void check_env_name(const std::string& k, const std::string& origin) {
  if (!valid_env_name(k))
    throw Error(origin + ": '" + text::excerpt(k, 80) + "' is not a valid environment variable name",
                "use letters, digits and '_', not starting with a digit");
  for (const auto& r : kReservedEnv)
    if (r == k)
      throw Error(origin + ": env '" + k + "' is set by mltrain for every rank and cannot be overridden",
                  "remove it; see docs/spec.md, Rank environment");
}

void check(const JobSpec& s) {
  std::string file = s.source.empty() ? std::string("command line") : s.source;
  if (!s.run.command && s.run.argv.empty())
    throw Error(file + ": nothing to run", "set [run] command or [run] argv, or give a command after '--'");
  if (s.run.command && s.run.command->empty())
    throw Error(s.origin("run.command", file) + ": [run] command is empty", "give a shell command");
  if (!s.cluster.include.empty() && !s.cluster.exclude.empty())
    throw Error(s.origin("cluster.include", file) + ": include and exclude (" +
                    s.origin("cluster.exclude", file) + ") cannot both be set",
                "keep one of them");
  check_durations(s, file);
  if (s.cluster.nprocs > kMaxRanks || s.cluster.procs_per_host > kMaxRanks)
    throw Error(s.origin(s.cluster.nprocs > kMaxRanks ? "cluster.nprocs" : "cluster.procs_per_host", file) +
                    ": more than " + std::to_string(kMaxRanks) + " ranks; mltrain runs at most that many",
                "lower nprocs / procs_per_host");
  check_gpus(s, file);
  check_ps(s, file);
  if (!s.setup.command.empty() && s.setup.command.find_first_not_of(" \t\n") == std::string::npos)
    throw Error(s.origin("setup.command", file) + ": [setup] command is empty",
                "give a shell command, or remove [setup]");
  for (const auto& n : s.name)
    if (!(std::isalnum(static_cast<unsigned char>(n)) || n == '-' || n == '_' || n == '.'))
      throw Error(s.origin("name", file) + ": name '" + text::excerpt(s.name, 80) +
                      "' may hold only letters, digits, '-', '_' and '.'",
                  "rename the job");
}

std::string keys_markdown() {
  std::string out = "| key | type | what it is |\n|---|---|---|\n";
  for (const auto& k : detail::keys()) {
    const std::string key = k.type == detail::Type::section ? "[" + k.path() + "]" : k.path();
    out += "| `" + key + "` | " + type_text(k) + " | " + std::string(k.doc) + " |\n";
  }
  return out;
}

}  // namespace mltrain::spec
