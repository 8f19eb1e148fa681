// Flag groups shared by the job verbs, so each verb's --help lists only the flags that apply:
// host flags (run, validate, doctor, bench), job flags (run, validate), console flags (run).
#pragma once

#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace mltrain::launch {
struct Overrides;
}

namespace mltrain::cli {

// An integer flag: CLI11 takes the text, text::parse_int_arg the number, so every integer flag
// says the same of a value out of range, negative or not a number (exit 2, the range named).
// `names` as CLI11 takes them ("-t,--tail"); the message names the long one.
CLI::Option* add_int_option(CLI::App* c, const std::string& names, int& value, long long lo, long long hi,
                            const std::string& help);

// Where ranks go: -n, --procs-per-host, --oversubscribe, -H, --hostfile, --include, --exclude,
// --ssh-config, --accept-new-host-keys.
void add_host_flags(CLI::App* c, launch::Overrides& f);

// What every rank runs with: --env, -x, --max-restarts, --timeout, --grace-period, --profile,
// --name, --workdir, --master-port.
void add_job_flags(CLI::App* c, launch::Overrides& f);

// How rank output shows on the console: --ranks, --no-prefix, --timestamps.
void add_console_flags(CLI::App* c, launch::Overrides& f);

// Rewrites the flags of other launchers (torchrun, mpirun, DeepSpeed) that mean the same as one of
// mltrain's: `-np 4` -> `-n 4`, `--nproc_per_node=2` -> `--procs-per-host=2`, `--master_port` ->
// `--master-port`, `--host` -> `-H`. A peer flag with no equal throws mltrain::Error naming the
// flag to use instead. `args` are mltrain's own words (before any "--").
void translate_peer_flags(std::vector<std::string>& args);

}  // namespace mltrain::cli
