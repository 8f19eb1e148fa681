// `mltrain bench`: runs the comm library's nccl-tests style benchmark as a job of mltrain itself
// (one rank per process, rank 0 prints the table), launched in process through launch::run.
// The ranks run the benchmark from the comm runtime the agent unpacked on each host
// ($MLTRAIN_RUNTIME/bin/mltrain-comm-bench, linked to the delivered libmltrain-comm): nothing of
// mltrain needs to be installed on the hosts.
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "knobs/parse.h"
#include "runner/common/error.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {

namespace {

// -b, -e and -f as the benchmark takes them (comm/tools/bench.cpp checks the same), refused here
// before any rank starts: nccl-tests' rules, sizes from -b to -e each the last times -f (a 0-byte
// start is one row, then the sizes go on from one element), at most 1000 of them.
void check_sizes(const std::string& min_text, const std::string& max_text, const std::string& factor_text) {
  auto bytes = [](const std::string& v, const char* flag) {
    auto b = knobs::parse_bytes(v);
    if (!b)
      throw Error(std::string(flag) + ": '" + v + "' is not a size", "write it like 0, 4096, 64K, 1M or 2G");
    return *b;
  };
  const uint64_t lo = bytes(min_text, "-b"), hi = bytes(max_text, "-e");
  if (lo > hi)
    throw Error("-b " + min_text + " is more than -e " + max_text,
                "give -b at most -e (the sizes grow from -b to -e)");
  char* end = nullptr;
  const double factor = std::strtod(factor_text.c_str(), &end);
  if (factor_text.empty() || *end != 0 || !std::isfinite(factor) || factor <= 1.0)
    throw Error("-f '" + factor_text + "' is not a number over 1",
                "each size is the last times -f: give e.g. -f 2");
  size_t rows = 0;
  for (double size = lo == 0 ? 1 : double(lo); size <= double(hi) * 1.0001; size *= factor)
    if (++rows > 1000)
      throw Error(
          "-b " + min_text + " to -e " + max_text + " by -f " + factor_text + " makes more than 1000 sizes",
          "raise -f or narrow -b/-e");
}

}  // namespace

void register_bench(CLI::App& app, Global& g, std::function<int()>& handler) {
  static struct {
    std::string job, op = "allreduce", redop = "sum", dtype = "f32";
    std::string min_bytes = "4K", max_bytes, factor = "2", stat = "median", backend = "tcp";
    std::string mode = "allreduce", servers;
    int iters = 20, warmup = 5;
    bool check = false, json = false;
    launch::Overrides hosts;
  } f;
  auto* c = app.add_subcommand("bench", "Measure collectives between the ranks of a job, like nccl-tests");
  c->add_option("job", f.job, "Job spec whose hosts to use (its command is ignored)");
  add_host_flags(c, f.hosts);
  c->add_option("--op", f.op, "Collective")
      ->check(CLI::IsMember({"allreduce", "broadcast", "allgather", "reduce_scatter"}));
  c->add_option("--redop", f.redop, "Reduction")->check(CLI::IsMember({"sum", "prod", "min", "max", "avg"}));
  c->add_option("--dtype", f.dtype, "Element type")
      ->check(CLI::IsMember({"f32", "f64", "f16", "bf16", "i32", "i64", "u8"}));
  c->add_option("-b,--minbytes", f.min_bytes, "Smallest message (K/M/G suffixes)");
  c->add_option("-e,--maxbytes", f.max_bytes, "Largest message (default 256M; 64M with --mode ps)");
  c->add_option("-f,--stepfactor", f.factor, "Size multiplier between rows");
  add_int_option(c, "--iters", f.iters, 1, 100000, "Timed iterations per size");
  add_int_option(c, "--warmup", f.warmup, 0, 100000, "Untimed iterations per size");
  c->add_option("--stat", f.stat, "Time statistic: median or mean")->check(CLI::IsMember({"median", "mean"}));
  c->add_option("--backend", f.backend,
                "tcp: host buffers over shared memory and TCP; nccl: device buffers through NCCL "
                "(each rank on GPU LOCAL_RANK of those it sees)")
      ->check(CLI::IsMember({"tcp", "nccl"}));
  c->add_option("--mode", f.mode,
                "allreduce: the collective; ps: push_pull through the job's PS servers ([ps], else one on "
                "every host) beside ring allreduce of the same bytes")
      ->check(CLI::IsMember({"allreduce", "ps"}));
  c->add_option("--servers", f.servers, "--mode ps: server counts to measure (default 1,2,4,... up to all)");
  // As `run` takes them (the same semantics); -e is --maxbytes here, as in nccl-tests.
  c->add_option("--env", f.hosts.env,
                "Set a variable for every rank (K=V; repeatable; -e is --maxbytes here)")
      ->allow_extra_args(false);
  c->add_option("-x", f.hosts.forward,
                "Forward the launcher's value of K to every rank (-x K), or set it (-x K=V); repeatable")
      ->allow_extra_args(false);
  c->add_flag("-c,--check", f.check, "Check every result against a reference (#wrong column)");
  c->add_flag("--json", f.json, "One JSON object per size instead of the table");
  c->footer(
      "Examples:\n  mltrain bench -n 4 -b 4K -e 256M -f 4\n  mltrain bench -n 2 --op allgather --dtype bf16 "
      "--check\n"
      "  mltrain bench --hostfile hosts.txt --procs-per-host 2\n"
      "  mltrain bench -n 8 --backend nccl -b 1M -e 1G -f 4\n"
      "  mltrain bench -n 4 -x NCCL_DEBUG=INFO --env MLTRAIN_COMM_ALGO=ring   (variables for the ranks)\n"
      "  mltrain bench ps-job.toml --mode ps -b 1M -e 64M -f 4   (push_pull through [ps] servers vs "
      "allreduce)\n"
      "The header says which allreduce algorithm the job uses and why. Columns: size, count, type, redop,\n"
      "time (us), algbw, busbw (GB/s), #wrong; allreduce busbw = algbw*2(n-1)/n. The table ends as\n"
      "nccl-tests' does: '# Out of bounds values : 0 OK' (with --check), '# Avg bus bandwidth    : N.NNN'\n"
      "(the mean busbw over the sizes).");
  c->callback([&] {
    handler = [&]() -> int {
      check_sizes(f.min_bytes, f.max_bytes.empty() ? (f.mode == "ps" ? "64M" : "256M") : f.max_bytes,
                  f.factor);
      // The benchmark is a job like any other, launched in this process.
      launch::JobRequest req;
      if (!f.job.empty()) req.specs = {f.job};
      auto& o = req.overrides;
      o = f.hosts;
      if (f.job.empty() && !o.nprocs && o.hostfile.empty() && !o.hosts) o.nprocs = 2;
      // The ranks run the delivered benchmark, not the user's code: any directory every host has will do.
      o.name = "bench";
      o.workdir = "/";
      o.ranks = "0";
      o.no_prefix = true;
      std::vector<std::string> cmd = {"/bin/sh",
                                      "-c",
                                      "exec \"${MLTRAIN_RUNTIME:?the agent could not unpack the mltrain "
                                      "runtime on this host}/bin/mltrain-comm-bench\" \"$@\"",
                                      "mltrain-bench",
                                      "--op",
                                      f.op,
                                      "--redop",
                                      f.redop,
                                      "--dtype",
                                      f.dtype,
                                      "-b",
                                      f.min_bytes,
                                      "-e",
                                      f.max_bytes.empty() ? (f.mode == "ps" ? "64M" : "256M") : f.max_bytes,
                                      "-f",
                                      f.factor,
                                      "--iters",
                                      std::to_string(f.iters),
                                      "--warmup",
                                      std::to_string(f.warmup),
                                      "--stat",
                                      f.stat};
      if (f.mode == "ps") {
        cmd.insert(cmd.end(), {"--mode", "ps"});
        if (!f.servers.empty()) cmd.insert(cmd.end(), {"--servers", f.servers});
        o.ps = true;
      }
      if (f.check) cmd.push_back("--check");
      if (f.json) cmd.push_back("--json");
      if (f.backend == "nccl") {
        cmd.push_back("--device");
        o.env.push_back("MLTRAIN_COMM_BACKEND=nccl");
      }
      req.command = std::move(cmd);
      req.color = use_color(g, 1);
      return launch::run(req).exit_code;
    };
  });
}

}  // namespace mltrain::cli
