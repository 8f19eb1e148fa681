// Rank planning and the rank environment contract (DESIGN.md, Contracts).
#include <doctest/doctest.h>

#include <map>

#include "runner/common/error.h"
#include "runner/plan/plan.h"
#include "temp_dir.h"

using namespace mltrain;
using mltrain::testing::TempDir;

namespace {

plan::Inputs inputs() {
  plan::Inputs in;
  in.run_id = "run-1";
  in.token = "secret";
  in.cwd = "/work";
  in.environ = {{"NCCL_DEBUG", "INFO"}, {"NCCL_ALGO", "Ring"}, {"HOME", "/root"}, {"RANK", "99"}};
  static int port = 40000;
  in.free_port = [] { return port++; };
  return in;
}

// Rank `rank`'s environment as plan `p` gives it at spawn.
std::map<std::string, std::string> env_of(const plan::Plan& p, size_t rank) {
  auto env = plan::rank_env(p, p.runtime, int(rank));
  return {env.begin(), env.end()};
}

spec::JobSpec job() {
  spec::JobSpec s;
  s.name = "t";
  s.run.argv = {"prog", "arg"};
  return s;
}

}  // namespace

TEST_CASE("plan: a recorded spec plans as the spec it came from (what rerun runs)") {
  TempDir d;
  auto s = spec::load_file(d.write("job.toml", "[run]\ncommand = 'x'\n[cluster]\nnprocs = 2\n"));
  auto again = spec::load_file(d.write("again.toml", spec::to_toml(s)));  // no host: this machine
  auto p = plan::make_plan(again, inputs());
  REQUIRE(p.ranks.size() == 2);
  CHECK(p.hosts.size() == 1);
  auto two =
      spec::load_file(d.write("two.toml", "[run]\ncommand = 'x'\n[cluster]\nhosts = ['a:1', 'b:1']\n"));
  auto back = spec::load_file(d.write("back.toml", spec::to_toml(two)));
  CHECK(plan::make_plan(back, inputs()).hosts.size() == 2);
}

TEST_CASE("plan: -n on localhost") {
  auto s = job();
  s.cluster.nprocs = 4;
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.ranks.size() == 4);
  REQUIRE(p.hosts.size() == 1);
  CHECK(p.hosts[0].local);
  CHECK_FALSE(p.multi_host);
  CHECK(p.master_addr == "127.0.0.1");
  for (int r = 0; r < 4; ++r) {
    auto e = env_of(p, size_t(r));
    CHECK(e["RANK"] == std::to_string(r));
    CHECK(e["LOCAL_RANK"] == std::to_string(r));
    CHECK(e["WORLD_SIZE"] == "4");
    CHECK(e["LOCAL_WORLD_SIZE"] == "4");
    CHECK(e["NODE_RANK"] == "0");
    CHECK(e["GROUP_RANK"] == "0");
    CHECK(e["MASTER_ADDR"] == "127.0.0.1");
    CHECK(e["MASTER_PORT"] == std::to_string(p.master_port));
    CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "0");
    CHECK(e["TORCHELASTIC_MAX_RESTARTS"] == "0");
    CHECK(e["TORCHELASTIC_RUN_ID"] == "run-1");
    CHECK(e["MLTRAIN_RUN_ID"] == "run-1");
    CHECK(e["MLTRAIN_TOKEN"] == "secret");
    CHECK(e["MLTRAIN_STORE_ADDR"] == p.store_addr);
    CHECK(e["NCCL_SOCKET_IFNAME"] == "lo");
    CHECK(e["GLOO_SOCKET_IFNAME"] == "lo");
    CHECK(e.count("CUDA_VISIBLE_DEVICES") == 0);
    CHECK(e.count("DMLC_ROLE") == 0);
  }
  CHECK(p.store_addr != "127.0.0.1:" + std::to_string(p.master_port));
  CHECK(p.argv == std::vector<std::string>{"prog", "arg"});
  CHECK(p.workdir == "/work");
}

TEST_CASE("plan: hosts in order with slots") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:3"};
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.ranks.size() == 5);
  CHECK(p.multi_host);
  CHECK(p.hosts[0].ranks == std::vector<int>{0, 1});
  CHECK(p.hosts[1].ranks == std::vector<int>{2, 3, 4});
  auto e3 = env_of(p, 3);
  CHECK(e3["RANK"] == "3");
  CHECK(e3["LOCAL_RANK"] == "1");
  CHECK(e3["LOCAL_WORLD_SIZE"] == "3");
  CHECK(e3["NODE_RANK"] == "1");
  CHECK(e3.count("NCCL_SOCKET_IFNAME") == 0);  // multi-host: chosen per host by the transport
}

TEST_CASE("plan: -n limits and spreads") {
  auto s = job();
  s.cluster.hosts = {"a:4,b:4"};
  s.cluster.nprocs = 6;
  auto p = plan::make_plan(s, inputs());
  CHECK(p.hosts[0].ranks.size() == 4);
  CHECK(p.hosts[1].ranks.size() == 2);

  s.cluster.nprocs = 9;
  CHECK_THROWS_WITH_AS(plan::make_plan(s, inputs()), doctest::Contains("only 8 slots"), Error);

  // A host written without a count has one slot (mpirun's rule): more ranks need --oversubscribe,
  // which deals the extra ranks round-robin.
  auto even = job();
  even.cluster.hosts = {"a,b,c"};
  even.cluster.nprocs = 7;
  CHECK_THROWS_WITH_AS(plan::make_plan(even, inputs()), doctest::Contains("only 3 slots"), Error);
  even.cluster.oversubscribe = true;
  auto q = plan::make_plan(even, inputs());
  CHECK(q.hosts[0].ranks.size() == 3);
  CHECK(q.hosts[1].ranks.size() == 2);
  CHECK(q.hosts[2].ranks.size() == 2);

  s.cluster.oversubscribe = true;
  auto r = plan::make_plan(s, inputs());
  CHECK(r.hosts[0].ranks.size() == 5);
  CHECK(r.hosts[1].ranks.size() == 4);
}

TEST_CASE("plan: an empty host list is an error, not localhost") {
  auto s = job();
  s.cluster.hosts = {""};
  s.origins["cluster.hosts"] = "-H";
  CHECK_THROWS_WITH_AS(plan::make_plan(s, inputs()), doctest::Contains("-H is empty"), Error);
}

TEST_CASE("plan: console ranks must exist") {
  auto s = job();
  s.cluster.nprocs = 2;
  s.logs.ranks = "0,5";
  CHECK_THROWS_WITH_AS(plan::make_plan(s, inputs()), doctest::Contains("rank 5 is not in this job"), Error);
}

TEST_CASE("plan: torchrun's extra variables, OMP_NUM_THREADS unless the user set it") {
  auto s = job();
  s.cluster.nprocs = 2;
  auto in = inputs();
  in.error_dir = "/runs/x";
  auto p = plan::make_plan(s, in);
  auto e = env_of(p, 1);
  CHECK(e["OMP_NUM_THREADS"] == "1");
  CHECK(e["ROLE_NAME"] == "default");
  CHECK(e["GROUP_WORLD_SIZE"] == "1");
  CHECK(e["TORCHELASTIC_ERROR_FILE"] == "/runs/x/rank-1.error.json");
  // Elsewhere a bare name, which the host's agent puts in its private folder: never a path in
  // /tmp that another user of the host can guess and take first.
  auto remote = s;
  remote.cluster.hosts = {"a:1,b:1"};
  auto rp = plan::make_plan(remote, in);
  REQUIRE(rp.ranks.size() == 2);
  for (const auto& r : rp.ranks) {
    REQUIRE_FALSE(rp.hosts[size_t(r.host)].local);
    CHECK(env_of(rp, size_t(r.rank))["TORCHELASTIC_ERROR_FILE"] ==
          "rank-" + std::to_string(r.rank) + ".error.json");
  }
  s.run.env.emplace_back("OMP_NUM_THREADS", "4");
  CHECK(env_of(plan::make_plan(s, in), 0)["OMP_NUM_THREADS"] == "4");
  s.cluster.nprocs = 1;
  s.run.env.clear();
  CHECK(env_of(plan::make_plan(s, in), 0).count("OMP_NUM_THREADS") == 0);
}

TEST_CASE("plan: procs_per_host overrides slots") {
  auto s = job();
  s.cluster.hosts = {"a:8,b:8"};
  s.cluster.procs_per_host = 2;
  auto p = plan::make_plan(s, inputs());
  CHECK(p.ranks.size() == 4);
}

TEST_CASE("plan: environment precedence: forwarded < spec env < contract") {
  auto s = job();
  s.cluster.nprocs = 1;
  s.run.forward_env = {"NCCL_*", "RANK"};
  s.run.env = {{"NCCL_ALGO", "Tree"}, {"X", "a b 'c' $d `e`\nf"}};
  auto e = env_of(plan::make_plan(s, inputs()), 0);
  CHECK(e["NCCL_DEBUG"] == "INFO");
  CHECK(e["NCCL_ALGO"] == "Tree");
  CHECK(e["X"] == "a b 'c' $d `e`\nf");
  CHECK(e["RANK"] == "0");  // forwarding RANK cannot break the contract
  CHECK(e.count("HOME") == 0);
}

TEST_CASE("plan: the user's interface choice stands") {
  auto s = job();
  s.run.env = {{"NCCL_SOCKET_IFNAME", "eth1"}};
  auto e = env_of(plan::make_plan(s, inputs()), 0);
  CHECK(e["NCCL_SOCKET_IFNAME"] == "eth1");
  CHECK(e["GLOO_SOCKET_IFNAME"] == "lo");
}

TEST_CASE("plan: GPUs per rank, shared GPUs, filtered slots") {
  auto s = job();
  s.cluster.nprocs = 2;
  s.gpus.per_proc = 2;
  auto p = plan::make_plan(s, inputs());
  CHECK(env_of(p, 0)["CUDA_VISIBLE_DEVICES"] == "0,1");
  CHECK(env_of(p, 1)["CUDA_VISIBLE_DEVICES"] == "2,3");

  auto sh = job();
  sh.cluster.nprocs = 4;
  sh.gpus.procs_per_gpu = 2;
  auto q = plan::make_plan(sh, inputs());
  CHECK(env_of(q, 1)["CUDA_VISIBLE_DEVICES"] == "0");
  CHECK(env_of(q, 2)["CUDA_VISIBLE_DEVICES"] == "1");

  auto f = job();
  f.cluster.hosts = {"a:4"};
  f.cluster.include = "a:1,3";
  f.gpus.per_proc = 1;
  auto r = plan::make_plan(f, inputs());
  REQUIRE(r.ranks.size() == 2);
  CHECK(env_of(r, 0)["CUDA_VISIBLE_DEVICES"] == "1");
  CHECK(env_of(r, 1)["CUDA_VISIBLE_DEVICES"] == "3");
}

TEST_CASE("plan: GPU slots per rank, and what each host must have") {
  auto s = job();
  s.cluster.hosts = {"h1:4,h2:4"};
  s.gpus.per_proc = 2;
  auto p = plan::make_plan(s, inputs());
  CHECK(p.hosts[0].gpu_slots_needed == 8);
  CHECK(p.ranks[5].gpu_slots == std::vector<int>{2, 3});
  CHECK(env_of(p, 5)["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID");
  CHECK(p.gpus_per_proc == 2);

  auto sh = job();
  sh.cluster.hosts = {"h1:5"};
  sh.gpus.procs_per_gpu = 2;
  auto q = plan::make_plan(sh, inputs());
  CHECK(q.hosts[0].gpu_slots_needed == 3);  // ranks 0,1 | 2,3 | 4
  CHECK(q.ranks[4].gpu_slots == std::vector<int>{2});

  auto cpu = job();
  cpu.cluster.nprocs = 2;
  cpu.run.env = {{"CUDA_VISIBLE_DEVICES", "1"}, {"MLTRAIN_NVML_LIBRARY", "/opt/nvml.so"}};
  auto c = plan::make_plan(cpu, inputs());
  CHECK(c.hosts[0].gpu_slots_needed == 0);             // no [gpus]: no host is asked
  CHECK(env_of(c, 1)["CUDA_VISIBLE_DEVICES"] == "1");  // the user's own value, untouched
  CHECK(env_of(c, 1).count("CUDA_DEVICE_ORDER") == 0);
  CHECK(c.user_cuda_visible_devices == "1");
  CHECK(c.nvml_library == "/opt/nvml.so");

  auto own = job();
  own.cluster.nprocs = 1;
  own.gpus.per_proc = 1;
  own.run.env = {{"CUDA_DEVICE_ORDER", "FASTEST_FIRST"}};
  CHECK(env_of(plan::make_plan(own, inputs()), 0)["CUDA_DEVICE_ORDER"] == "FASTEST_FIRST");
}

namespace {
plan::HostGpus h100s(int n) {
  plan::HostGpus g;
  for (int i = 0; i < n; ++i) {
    g.indices.push_back(i);
    g.names.push_back("NVIDIA H100 80GB HBM3");
    g.usable.push_back(i);
  }
  return g;
}
}  // namespace

TEST_CASE("plan: GPUs assigned from a host's inventory, or a line naming the host") {
  // 2 hosts x 4 GPUs.
  auto job_with = [](int per_proc, int procs_per_gpu, int ranks_per_host) {
    auto s = job();
    std::string n = std::to_string(ranks_per_host);
    s.cluster.hosts = {"h1:" + n + ",h2:" + n};
    s.gpus.per_proc = per_proc;
    s.gpus.procs_per_gpu = procs_per_gpu;
    return plan::make_plan(s, inputs());
  };
  auto cvd = [](const plan::Plan& p) {
    std::vector<std::string> v;
    for (const auto& r : p.ranks) v.push_back(env_of(p, size_t(r.rank))["CUDA_VISIBLE_DEVICES"]);
    return v;
  };
  using V = std::vector<std::string>;

  auto one = job_with(1, 0, 4);
  CHECK(plan::assign_gpus(one, 0, h100s(4)) == "");
  CHECK(plan::assign_gpus(one, 1, h100s(4)) == "");
  CHECK(cvd(one) == V{"0", "1", "2", "3", "0", "1", "2", "3"});

  auto two = job_with(2, 0, 2);
  CHECK(plan::assign_gpus(two, 0, h100s(4)) == "");
  CHECK(plan::assign_gpus(two, 1, h100s(4)) == "");
  CHECK(cvd(two) == V{"0,1", "2,3", "0,1", "2,3"});

  auto shared = job_with(0, 2, 4);
  CHECK(plan::assign_gpus(shared, 0, h100s(4)) == "");
  CHECK(plan::assign_gpus(shared, 1, h100s(4)) == "");
  CHECK(cvd(shared) == V{"0", "0", "1", "1", "0", "0", "1", "1"});

  // Too small: h2 has 2 GPUs.
  auto small = job_with(2, 0, 4);
  CHECK(plan::assign_gpus(small, 0, h100s(4)) ==
        "h1: [gpus] per_proc = 2 for 4 ranks needs 8 GPUs; h1 has 4 (GPU 0-3: NVIDIA H100 80GB HBM3)");
  CHECK(plan::assign_gpus(small, 1, h100s(2)) ==
        "h2: [gpus] per_proc = 2 for 4 ranks needs 8 GPUs; h2 has 2 (GPU 0,1: NVIDIA H100 80GB HBM3)");
  auto sharing_small = job_with(0, 2, 4);
  CHECK(plan::assign_gpus(sharing_small, 1, h100s(1)) ==
        "h2: [gpus] procs_per_gpu = 2 for 4 ranks needs 2 GPUs; h2 has 1 (GPU 0: NVIDIA H100 80GB HBM3)");

  // A CUDA_VISIBLE_DEVICES set on the host restricts it, in its order.
  auto restricted = job_with(1, 0, 2);
  auto g = h100s(4);
  g.usable = {3, 1};
  g.cuda_visible_devices = "3,1";
  CHECK(plan::assign_gpus(restricted, 1, g) == "");
  CHECK(cvd(restricted)[2] == "3");
  CHECK(cvd(restricted)[3] == "1");
  auto too_restricted = job_with(1, 0, 4);
  CHECK(plan::assign_gpus(too_restricted, 1, g) ==
        "h2: [gpus] per_proc = 1 for 4 ranks needs 4 GPUs; h2 has 2 usable (CUDA_VISIBLE_DEVICES=3,1) of 4 "
        "(GPU 0-3: NVIDIA H100 80GB HBM3)");
  CHECK(cvd(too_restricted)[4] == "0");  // a failed host keeps the plan's env
  g.usable.clear();
  g.cuda_visible_devices = "";
  CHECK(plan::assign_gpus(too_restricted, 1, g) ==
        "h2: [gpus] per_proc = 1 but no GPU of h2 is usable (CUDA_VISIBLE_DEVICES=''; h2 has 4: GPU 0-3: "
        "NVIDIA H100 80GB HBM3)");

  // No GPU at all: the agent's reason.
  plan::HostGpus none;
  none.note = "no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi not in PATH";
  CHECK(
      plan::assign_gpus(one, 1, none) ==
      "h2: [gpus] per_proc = 1 but h2 has no GPU (no NVIDIA driver: libnvidia-ml.so.1 not found, nvidia-smi "
      "not in PATH)");
}

TEST_CASE("plan: include/exclude slot ids must be among a host's usable GPUs") {
  auto f = job();
  f.cluster.hosts = {"a:4"};
  f.cluster.include = "a:1,3";
  f.gpus.per_proc = 1;
  auto p = plan::make_plan(f, inputs());
  auto g = h100s(4);
  CHECK(plan::assign_gpus(p, 0, g) == "");
  CHECK(env_of(p, 1)["CUDA_VISIBLE_DEVICES"] == "3");
  g.usable = {0, 1};
  g.cuda_visible_devices = "0,1";
  CHECK(plan::assign_gpus(p, 0, g) ==
        "a: the include/exclude slot ids give rank 1 GPU 3, which CUDA_VISIBLE_DEVICES=0,1 hides on a");
  CHECK(plan::assign_gpus(p, 0, h100s(2)) ==
        "a: the include/exclude slot ids give rank 1 GPU 3, which a does not have (it has 2: GPU 0,1: NVIDIA "
        "H100 "
        "80GB HBM3)");
}

TEST_CASE("plan: GPUs described by runs of one name") {
  std::vector<std::string> h(4, "H100");
  CHECK(plan::describe_gpus({0, 1, 2, 3}, h) == "GPU 0-3: H100");
  CHECK(plan::describe_gpus({0, 2, 3}, {"H100", "H100", "H100"}) == "GPU 0,2,3: H100");
  CHECK(plan::describe_gpus({0, 1, 2}, {"A", "A", "B"}) == "GPU 0,1: A; GPU 2: B");
  CHECK(plan::describe_gpus({}, {}) == "");
}

TEST_CASE("plan: PS mode variables") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:2"};
  s.comm.mode = "ps";
  auto p = plan::make_plan(s, inputs());
  auto e = env_of(p, 3);
  CHECK(e["DMLC_ROLE"] == "worker");
  CHECK(e["DMLC_NUM_WORKER"] == "4");
  CHECK(e["DMLC_NUM_SERVER"] == "2");
  CHECK(e["DMLC_PS_ROOT_URI"] == p.master_addr);
  CHECK(e["DMLC_WORKER_ID"] == "3");
  CHECK(std::stoi(e["DMLC_PS_ROOT_PORT"]) > 0);
}

TEST_CASE("plan: command runs under /bin/sh -c") {
  auto s = job();
  s.run.argv.clear();
  s.run.command = "echo $RANK";
  auto p = plan::make_plan(s, inputs());
  CHECK(p.argv == std::vector<std::string>{"/bin/sh", "-c", "echo $RANK"});
}

TEST_CASE("plan: SLURM_JOB_NODELIST when no hosts are given") {
  auto s = job();
  auto in = inputs();
  in.environ["SLURM_JOB_NODELIST"] = "gpu[01-03]";
  auto p = plan::make_plan(s, in);
  REQUIRE(p.hosts.size() == 3);
  CHECK(p.hosts[2].host.name == "gpu03");
}

TEST_CASE("plan: restarts bump TORCHELASTIC_RESTART_COUNT") {
  auto s = job();
  s.cluster.nprocs = 2;
  auto p = plan::make_plan(s, inputs());
  plan::set_restart_count(p, 2);
  CHECK(env_of(p, 1)["TORCHELASTIC_RESTART_COUNT"] == "2");
}

TEST_CASE(
    "plan: MLTRAIN_CHECKPOINT_DIR is one folder per run below the host's home, unless the job sets it") {
  auto s = job();
  s.cluster.nprocs = 2;
  auto p = plan::make_plan(s, inputs());
  CHECK(env_of(p, 0)["MLTRAIN_CHECKPOINT_DIR"] == "~/.cache/mltrain/checkpoints/run-1");
  CHECK(env_of(p, 1)["MLTRAIN_CHECKPOINT_DIR"] == "~/.cache/mltrain/checkpoints/run-1");
  s.run.env.push_back({"MLTRAIN_CHECKPOINT_DIR", "/data/ckpt"});
  CHECK(env_of(plan::make_plan(s, inputs()), 1)["MLTRAIN_CHECKPOINT_DIR"] == "/data/ckpt");
}

namespace {
// Three hosts of two ranks, one GPU each, min_hosts 2 and the spare d.
spec::JobSpec elastic_job() {
  auto s = job();
  s.cluster.hosts = {"a:2", "b:2", "c:2"};
  s.run.max_restarts = 2;
  s.cluster.min_hosts = 2;
  s.cluster.spares = {"d:2"};
  s.gpus.per_proc = 1;
  return s;
}
}  // namespace

TEST_CASE("plan: spares come after the hosts with no ranks; min_hosts is checked") {
  auto s = elastic_job();
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.hosts.size() == 4);
  CHECK(p.min_hosts == 2);
  CHECK(p.elastic());
  CHECK(p.hosts[3].host.name == "d");
  CHECK(p.hosts[3].spare);
  CHECK(p.hosts[3].ranks.empty());
  CHECK(p.hosts[3].node_rank == -1);
  CHECK(p.hosts[3].runs_program());
  CHECK(p.hosts[3].gpu_slots_needed == 2);  // ready to take any host's place
  CHECK(p.ranks.size() == 6);
  CHECK(env_of(p, 5)["GROUP_WORLD_SIZE"] == "3");  // a spare is no node until it runs ranks

  // Spares alone: a restart keeps every place.
  s.cluster.min_hosts = 0;
  CHECK(plan::make_plan(s, inputs()).min_hosts == 3);

  auto refused = [&](spec::JobSpec bad, const std::string& what) {
    std::string message;
    try {
      plan::make_plan(bad, inputs());
    } catch (const Error& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find(what) != std::string::npos);
  };
  auto too_many = s;
  too_many.cluster.min_hosts = 4;
  refused(too_many, "min_hosts is 4 but the job has 3 hosts");
  auto no_restarts = s;
  no_restarts.run.max_restarts = 0;
  refused(no_restarts, "max_restarts is 0");
  auto twice = s;
  twice.cluster.spares = {"b"};
  refused(twice, "b is one of the job's hosts and a spare");
  auto ps = s;
  ps.comm.mode = "ps";
  refused(ps, "not for PS mode");
}

TEST_CASE("plan: a spare's GPUs are checked against what any host's ranks need") {
  auto p = plan::make_plan(elastic_job(), inputs());
  CHECK(plan::assign_gpus(p, 3, {{0, 1}, {"A", "A"}, {0, 1}, "", std::nullopt}) == "");
  CHECK(
      plan::assign_gpus(p, 3, {{0, 1}, {"A", "A"}, {1}, "", std::nullopt}) ==
      "d: a spare must be ready for any host's ranks, which need up to 2 GPUs ([gpus] per_proc = 1); d has 1 "
      "usable");
  CHECK(p.runtime.gpus.empty());  // nothing assigned: it runs no rank yet
}

TEST_CASE("plan: regroup numbers the ranks anew on the gang it is given") {
  auto p = plan::make_plan(elastic_job(), inputs());
  REQUIRE(plan::assign_gpus(p, 0, {{0, 1}, {"A", "A"}, {0, 1}, "", std::nullopt}) == "");
  // b is lost; d takes its place; a keeps node 0.
  plan::regroup(p, {0, 3, 2}, {{{0}, {1}}, {{0}, {1}}, {{0}, {1}}});
  plan::set_restart_count(p, 1);
  REQUIRE(p.ranks.size() == 6);
  CHECK(p.hosts[1].ranks.empty());
  CHECK(p.hosts[1].node_rank == -1);
  CHECK(p.hosts[3].node_rank == 1);
  CHECK(p.hosts[3].ranks == std::vector<int>{2, 3});
  CHECK(p.hosts[2].node_rank == 2);
  CHECK(p.runtime.gpus.empty());  // assigned again at the restart
  auto e = env_of(p, 3);
  CHECK(e["RANK"] == "3");
  CHECK(e["LOCAL_RANK"] == "1");
  CHECK(e["NODE_RANK"] == "1");
  CHECK(e["WORLD_SIZE"] == "6");
  CHECK(e["GROUP_WORLD_SIZE"] == "3");
  CHECK(e["CUDA_VISIBLE_DEVICES"] == "1");
  CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
  // Without a spare: two hosts, four ranks.
  plan::regroup(p, {0, 2}, {{{0}, {1}}, {{0}, {1}}});
  CHECK(p.ranks.size() == 4);
  CHECK(env_of(p, 3)["WORLD_SIZE"] == "4");
  CHECK(env_of(p, 3)["NODE_RANK"] == "1");
  CHECK(env_of(p, 3)["GROUP_WORLD_SIZE"] == "2");
  CHECK(p.ranks[2].host == 2);
}

TEST_CASE("plan: hostfile errors become spec errors") {
  auto s = job();
  s.cluster.hosts = {"a:x"};
  try {
    plan::make_plan(s, inputs());
    FAIL("no error");
  } catch (const Error& e) {
    CHECK(e.code() == 2);
    CHECK(std::string(e.what()).find("a:x") != std::string::npos);
  }
}

TEST_CASE("plan: PS defaults: a server on every worker host, sync, 4 MiB partitions") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:2"};
  s.comm.mode = "ps";
  auto p = plan::make_plan(s, inputs());
  CHECK(p.ps_mode);
  REQUIRE(p.hosts.size() == 2);
  CHECK(p.hosts[0].ps_servers == 1);
  CHECK(p.hosts[1].ps_servers == 1);
  CHECK(p.ps.servers == 2);
  CHECK(p.ps.sync);
  CHECK(p.ps.partition_bytes == (4u << 20));
  CHECK(p.ps.optimizer.empty());
  auto e = env_of(p, 0);
  CHECK(e["MLTRAIN_PS_SYNC"] == "1");
  CHECK(e["MLTRAIN_PS_PARTITION_BYTES"] == "4194304");
  CHECK(e.count("MLTRAIN_PS_SERVERS") == 0);  // set at preflight, when the servers listen
  // Not PS mode: no servers and none of its variables.
  s.comm.mode = "allreduce";
  auto q = plan::make_plan(s, inputs());
  CHECK(q.hosts[0].ps_servers == 0);
  CHECK(q.ps.servers == 0);
  CHECK(env_of(q, 0).count("MLTRAIN_PS_SYNC") == 0);
}

TEST_CASE("plan: [ps] hosts: a server-only host comes after the hosts with ranks") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:2"};
  s.cluster.oversubscribe = true;
  s.cluster.nprocs = 6;  // oversubscribed: still no rank on a server-only host
  s.comm.mode = "ps";
  s.ps.present = true;
  s.ps.hosts = {"bob@c:2", "B"};  // "B" is the worker host b (names compare without case)
  s.ps.servers_per_host = 2;
  s.ps.sync = false;
  s.ps.partition_bytes = 65536;
  s.ps.optimizer = {"sgd", 0.1, 0.9, 0.001};
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.hosts.size() == 3);
  CHECK(p.multi_host);
  CHECK(p.hosts[0].host.name == "a");
  CHECK(p.hosts[0].node_rank == 0);
  CHECK(p.hosts[0].ps_servers == 0);
  CHECK(p.hosts[1].host.name == "b");
  CHECK(p.hosts[1].node_rank == 1);
  CHECK(p.hosts[1].ps_servers == 2);
  CHECK(p.hosts[1].ranks.size() == 3);
  const auto& c = p.hosts[2];
  CHECK(c.host.name == "c");
  CHECK(c.host.user == "bob");
  CHECK(c.host.role == hostfile::Role::server);
  CHECK(c.ranks.empty());
  CHECK(c.node_rank == -1);
  CHECK(c.ps_servers == 2);
  CHECK_FALSE(c.local);
  CHECK(p.ranks.size() == 6);
  CHECK(p.ps.servers == 4);
  CHECK_FALSE(p.ps.sync);
  CHECK(p.ps.optimizer == "sgd");
  CHECK(p.ps.lr == doctest::Approx(0.1));
  CHECK(p.ps.momentum == doctest::Approx(0.9));
  CHECK(p.ps.weight_decay == doctest::Approx(0.001));
  for (const auto& r : p.ranks) {
    CHECK(r.host < 2);
    auto e = env_of(p, size_t(r.rank));
    CHECK(e["GROUP_WORLD_SIZE"] == "2");
    CHECK(e["DMLC_ROLE"] == "worker");
    CHECK(e["DMLC_NUM_WORKER"] == "6");
    CHECK(e["DMLC_NUM_SERVER"] == "4");
    CHECK(e["DMLC_WORKER_ID"] == std::to_string(r.rank));
    CHECK(e["DMLC_PS_ROOT_URI"] == "a");
    CHECK(e["MLTRAIN_PS_SYNC"] == "0");
    CHECK(e["MLTRAIN_PS_PARTITION_BYTES"] == "65536");
  }
  CHECK(env_of(p, 4)["NODE_RANK"] == "1");

  // doctor and validate see every host, the server-only one included.
  auto hosts = plan::resolve_hosts(s, {});
  REQUIRE(hosts.size() == 3);
  CHECK(hosts[2].name == "c");

  // MLTRAIN_PS_SERVERS: the servers in order, in every rank's env.
  plan::set_ps_servers(p, {"b=10.0.0.2:7000", "b=10.0.0.2:7001", "c=10.0.0.3:7000", "c=10.0.0.3:7001"});
  for (const auto& r : p.ranks)
    CHECK(env_of(p, size_t(r.rank))["MLTRAIN_PS_SERVERS"] ==
          "b=10.0.0.2:7000,b=10.0.0.2:7001,c=10.0.0.3:7000,c=10.0.0.3:7001");
}

TEST_CASE("plan: hostfile roles: server hosts get no ranks, both hosts get ranks and servers") {
  TempDir d;
  auto s = job();
  s.cluster.hostfile =
      d.write("hosts.txt", "s1 slots=8 role=server\na slots=2\nb slots=2 role=both\ns2 role=server\n");
  s.comm.mode = "ps";
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.hosts.size() == 4);
  CHECK(p.hosts[0].host.name == "a");  // rank 0's host first, though s1 is written before it
  CHECK(p.hosts[0].ranks == std::vector<int>{0, 1});
  CHECK(p.hosts[0].ps_servers == 0);
  CHECK(p.hosts[1].host.name == "b");
  CHECK(p.hosts[1].ranks == std::vector<int>{2, 3});
  CHECK(p.hosts[1].ps_servers == 1);
  CHECK(p.hosts[2].host.name == "s1");
  CHECK(p.hosts[2].ranks.empty());
  CHECK(p.hosts[2].ps_servers == 1);
  CHECK(p.hosts[3].host.name == "s2");
  CHECK(p.ps.servers == 3);
  CHECK(env_of(p, 0)["DMLC_NUM_SERVER"] == "3");
  CHECK(env_of(p, 0)["GROUP_WORLD_SIZE"] == "2");

  // [ps] hosts win over the roles; role=server hosts not named there are left out.
  s.ps.hosts = {"a"};
  auto q = plan::make_plan(s, inputs());
  REQUIRE(q.hosts.size() == 2);
  CHECK(q.hosts[0].ps_servers == 1);
  CHECK(q.hosts[1].ps_servers == 0);

  // Outside PS mode role=server hosts run nothing.
  s.comm.mode = "allreduce";
  s.ps.hosts.clear();
  auto r = plan::make_plan(s, inputs());
  REQUIRE(r.hosts.size() == 2);
  CHECK(r.ranks.size() == 4);

  // Only servers: no host for the ranks.
  s.cluster.hostfile = d.write("servers.txt", "s1 role=server\n");
  CHECK_THROWS_WITH_AS(plan::make_plan(s, inputs()),
                       doctest::Contains("is role=server: no host is left for the ranks"), Error);
}

TEST_CASE("plan: [comm] num_servers spreads over the server hosts, the first taking the extra") {
  auto s = job();
  s.cluster.hosts = {"a:1,b:1,c:1"};
  s.comm.mode = "ps";
  s.comm.num_servers = 5;
  auto p = plan::make_plan(s, inputs());
  CHECK(p.hosts[0].ps_servers == 2);
  CHECK(p.hosts[1].ps_servers == 2);
  CHECK(p.hosts[2].ps_servers == 1);
  CHECK(p.ps.servers == 5);
  CHECK(env_of(p, 0)["DMLC_NUM_SERVER"] == "5");
  // Fewer servers than hosts: the last hosts run none.
  s.comm.num_servers = 2;
  auto q = plan::make_plan(s, inputs());
  CHECK(q.hosts[0].ps_servers == 1);
  CHECK(q.hosts[1].ps_servers == 1);
  CHECK(q.hosts[2].ps_servers == 0);
  // Over [ps] hosts that have no ranks: only they get servers.
  s.comm.num_servers = 3;
  s.ps.hosts = {"s1", "s2"};
  auto r = plan::make_plan(s, inputs());
  REQUIRE(r.hosts.size() == 5);
  CHECK(r.hosts[3].ps_servers == 2);
  CHECK(r.hosts[4].ps_servers == 1);
  CHECK(r.hosts[0].ps_servers == 0);
}

TEST_CASE("plan: a local job with a server on this machine stays one host") {
  auto s = job();
  s.cluster.nprocs = 2;
  s.comm.mode = "ps";
  s.ps.hosts = {"127.0.0.1"};
  auto p = plan::make_plan(s, inputs());
  REQUIRE(p.hosts.size() == 1);
  CHECK(p.hosts[0].ps_servers == 1);
  CHECK_FALSE(p.multi_host);
  // A remote server host makes the job multi-host: the ranks' addresses must reach it.
  s.ps.hosts = {"far"};
  auto q = plan::make_plan(s, inputs());
  REQUIRE(q.hosts.size() == 2);
  CHECK(q.multi_host);
  CHECK(q.hosts[1].ranks.empty());
  CHECK(env_of(q, 0).count("NCCL_SOCKET_IFNAME") == 0);
}

namespace {
std::vector<std::string> keys_of(const plan::Env& env) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : env) keys.push_back(k);
  return keys;
}
}  // namespace

TEST_CASE("plan: rank_env is one pure function of the plan's facts and what preflight learnt") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:1"};
  s.comm.mode = "ps";
  s.gpus.per_proc = 1;
  s.run.forward_env = {"NCCL_*"};
  s.run.env = {{"ROLE_NAME", "mine"}, {"X", "1"}};
  auto p = plan::make_plan(s, inputs());
  const plan::Plan planned = p;

  // The job's variables first (forwarded, then the spec's; a contract variable it wrote keeps its
  // place), then the contract, the defaults, the GPUs and PS mode's.
  const std::vector<std::string> contract = {"NCCL_ALGO",
                                             "NCCL_DEBUG",
                                             "ROLE_NAME",
                                             "X",
                                             "RANK",
                                             "WORLD_SIZE",
                                             "LOCAL_RANK",
                                             "LOCAL_WORLD_SIZE",
                                             "NODE_RANK",
                                             "GROUP_RANK",
                                             "GROUP_WORLD_SIZE",
                                             "ROLE_RANK",
                                             "ROLE_WORLD_SIZE",
                                             "MASTER_ADDR",
                                             "MASTER_PORT",
                                             "TORCHELASTIC_RESTART_COUNT",
                                             "TORCHELASTIC_MAX_RESTARTS",
                                             "TORCHELASTIC_RUN_ID",
                                             "MLTRAIN_RUN_ID",
                                             "MLTRAIN_STORE_ADDR",
                                             "MLTRAIN_TOKEN",
                                             "MLTRAIN_COMM_BACKEND",
                                             "MLTRAIN_CHECKPOINT_DIR",
                                             "TORCHELASTIC_ERROR_FILE",
                                             "OMP_NUM_THREADS",
                                             "PYTHONUNBUFFERED",
                                             "CUDA_VISIBLE_DEVICES",
                                             "CUDA_DEVICE_ORDER",
                                             "DMLC_ROLE",
                                             "DMLC_NUM_WORKER",
                                             "DMLC_NUM_SERVER",
                                             "DMLC_PS_ROOT_URI",
                                             "DMLC_PS_ROOT_PORT",
                                             "DMLC_WORKER_ID",
                                             "MLTRAIN_PS_SYNC",
                                             "MLTRAIN_PS_PARTITION_BYTES"};
  CHECK(keys_of(plan::rank_env(p, p.runtime, 0)) == contract);
  CHECK(env_of(p, 0)["ROLE_NAME"] == "default");

  // What preflight learns: each value where it stands, the interface and the servers after the rest.
  plan::set_rendezvous(p, {"10.0.0.1", 29400, 29401, 29402});
  plan::set_interface(p, 0, "eth0");
  plan::set_interface(p, 1, "");  // an agent that found no route changes nothing
  REQUIRE(plan::assign_gpus(p, 0, {{0, 1, 2}, {"A", "A", "A"}, {2, 0}, "", std::nullopt}) == "");
  plan::set_ps_servers(p, {"a=10.0.0.1:7000", "b=10.0.0.2:7000"});
  plan::set_restart_count(p, 1);
  auto with_runtime = contract;
  for (const char* k : {"NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME", "MLTRAIN_PS_SERVERS"})
    with_runtime.push_back(k);
  CHECK(keys_of(plan::rank_env(p, p.runtime, 1)) == with_runtime);
  auto e = env_of(p, 1);
  CHECK(e["CUDA_VISIBLE_DEVICES"] == "0");  // rank 1 has slot 1: the second of a's usable GPUs {2, 0}
  CHECK(e["NCCL_SOCKET_IFNAME"] == "eth0");
  CHECK(e["TORCHELASTIC_RESTART_COUNT"] == "1");
  // The master address lives in the plan alone: every variable that names it follows.
  CHECK(e["MASTER_ADDR"] == "10.0.0.1");
  CHECK(e["DMLC_PS_ROOT_URI"] == "10.0.0.1");
  CHECK(e["MLTRAIN_STORE_ADDR"] == "10.0.0.1:29401");
  CHECK(e["DMLC_PS_ROOT_PORT"] == "29402");
  auto b = env_of(p, 2);  // host b: no interface learnt, its GPUs still as planned
  CHECK(b.count("NCCL_SOCKET_IFNAME") == 0);
  CHECK(b["CUDA_VISIBLE_DEVICES"] == "0");

  // Pure: the same facts give the same environment, and another runtime leaves the plan alone.
  CHECK(plan::rank_env(p, p.runtime, 1) == plan::rank_env(p, p.runtime, 1));
  plan::Runtime later = p.runtime;
  later.restart_count = 5;
  CHECK(env_of(p, 1)["TORCHELASTIC_RESTART_COUNT"] == "1");
  std::map<std::string, std::string> at_5;
  for (const auto& [k, v] : plan::rank_env(p, later, 1)) at_5[k] = v;
  CHECK(at_5["TORCHELASTIC_RESTART_COUNT"] == "5");
  CHECK(plan::rank_env(planned, planned.runtime, 1) != plan::rank_env(p, p.runtime, 1));
  CHECK(keys_of(plan::rank_env(planned, planned.runtime, 1)) == contract);
}
