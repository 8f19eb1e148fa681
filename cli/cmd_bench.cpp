// `mltrain bench`: runs the comm library's nccl-tests style benchmark as a job of mltrain itself
// (one rank per process, rank 0 prints the table). `mltrain __bench-worker` is the rank side.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <climits>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "cli/commands.h"
#include "mltrain/bench.hpp"
#include "runner/common/error.h"

namespace mltrain::cli {

namespace {

std::string self_exe() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) throw Error("cannot find the mltrain executable (/proc/self/exe)", {}, exit_code::internal);
  return std::string(buf, size_t(n));
}

}  // namespace

int bench_worker_main(int argc, char** argv) { return comm::bench_main(argc, argv); }

void register_bench(CLI::App& app, Global& g, std::function<int()>& handler) {
  static struct {
    std::string job, hostfile, hosts, ssh_config, op = "allreduce", redop = "sum", dtype = "f32";
    std::string min_bytes = "4K", max_bytes = "256M", factor = "2", stat = "median";
    int nprocs = 0, procs_per_host = 0, iters = 20, warmup = 5;
    bool check = false, json = false, accept_new = false;
  } f;
  auto* c = app.add_subcommand("bench", "Measure collectives between the ranks of a job, like nccl-tests");
  c->add_option("job", f.job, "Job spec whose hosts to use (its command is ignored)");
  c->add_option("-n,--nprocs", f.nprocs, "Number of ranks, as in 'run'")->check(CLI::Range(1, 4096));
  c->add_option("--procs-per-host", f.procs_per_host, "Ranks on each host")->check(CLI::Range(1, 4096));
  c->add_option("--hostfile", f.hostfile, "Hostfile");
  c->add_option("-H,--hosts", f.hosts, "Hosts, e.g. 'a:2,b:2'");
  c->add_option("--ssh-config", f.ssh_config, "ssh config file");
  c->add_flag("--accept-new-host-keys", f.accept_new, "Accept and record unknown host keys");
  c->add_option("--op", f.op, "Collective")->check(CLI::IsMember({"allreduce", "broadcast", "allgather", "reduce_scatter"}));
  c->add_option("--redop", f.redop, "Reduction")->check(CLI::IsMember({"sum", "prod", "min", "max", "avg"}));
  c->add_option("--dtype", f.dtype, "Element type")->check(CLI::IsMember({"f32", "f64", "f16", "bf16", "i32", "i64", "u8"}));
  c->add_option("-b,--minbytes", f.min_bytes, "Smallest message (K/M/G suffixes)");
  c->add_option("-e,--maxbytes", f.max_bytes, "Largest message");
  c->add_option("-f,--stepfactor", f.factor, "Size multiplier between rows");
  c->add_option("--iters", f.iters, "Timed iterations per size")->check(CLI::Range(1, 100000));
  c->add_option("--warmup", f.warmup, "Untimed iterations per size")->check(CLI::Range(0, 100000));
  c->add_option("--stat", f.stat, "Time statistic: median or mean")->check(CLI::IsMember({"median", "mean"}));
  c->add_flag("-c,--check", f.check, "Check every result against a reference (#wrong column)");
  c->add_flag("--json", f.json, "One JSON object per size instead of the table");
  c->footer("Examples:\n  mltrain bench -n 4 -b 4K -e 256M -f 4\n  mltrain bench -n 2 --op allgather --dtype bf16 --check\n"
            "  mltrain bench --hostfile hosts.txt --procs-per-host 2\n"
            "Columns: size, count, type, redop, time (us), algbw, busbw (GB/s), #wrong; allreduce busbw = algbw*2(n-1)/n.");
  c->callback([&] {
    handler = [&]() -> int {
      // The benchmark is a job like any other: mltrain runs itself as every rank.
      std::vector<std::string> args = {"run"};
      if (!f.job.empty()) args.push_back(f.job);
      if (f.nprocs) args.insert(args.end(), {"-n", std::to_string(f.nprocs)});
      if (f.procs_per_host) args.insert(args.end(), {"--procs-per-host", std::to_string(f.procs_per_host)});
      if (!f.hostfile.empty()) args.insert(args.end(), {"--hostfile", f.hostfile});
      if (!f.hosts.empty()) args.insert(args.end(), {"-H", f.hosts});
      if (!f.ssh_config.empty()) args.insert(args.end(), {"--ssh-config", f.ssh_config});
      if (f.accept_new) args.push_back("--accept-new-host-keys");
      if (f.job.empty() && !f.nprocs && f.hostfile.empty() && f.hosts.empty()) args.insert(args.end(), {"-n", "2"});
      // The ranks run mltrain itself, not the user's code: any directory every host has will do.
      args.insert(args.end(), {"--name", "bench", "--workdir", "/", "--ranks", "0", "--no-prefix", "--"});
      args.insert(args.end(), {self_exe(), "__bench-worker", "--op", f.op, "--redop", f.redop, "--dtype", f.dtype, "-b",
                               f.min_bytes, "-e", f.max_bytes, "-f", f.factor, "--iters", std::to_string(f.iters),
                               "--warmup", std::to_string(f.warmup), "--stat", f.stat});
      if (f.check) args.push_back("--check");
      if (f.json) args.push_back("--json");
      // Re-enter as `mltrain run ...`: the same code path as any job.
      std::vector<std::string> full = {"mltrain", "--color", g.color};
      for (int v = 0; v < g.verbose; ++v) full.push_back("-v");
      full.insert(full.end(), args.begin(), args.end());
      std::vector<char*> cargs;
      for (auto& a : full) cargs.push_back(a.data());
      cargs.push_back(nullptr);
      std::string exe = self_exe();
      std::fflush(stdout);
      ::execv(exe.c_str(), cargs.data());
      throw Error("cannot run " + exe + ": " + std::strerror(errno), {}, exit_code::internal);
    };
  });
}

}  // namespace mltrain::cli
