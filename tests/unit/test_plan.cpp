// Rank planning and the rank environment contract (DESIGN.md, Contracts).
#include <doctest/doctest.h>

#include <map>

#include "runner/common/error.h"
#include "runner/plan/plan.h"

using namespace mltrain;

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

std::map<std::string, std::string> env_of(const plan::RankPlan& r) { return {r.env.begin(), r.env.end()}; }

spec::JobSpec job() {
  spec::JobSpec s;
  s.name = "t";
  s.run.argv = {"prog", "arg"};
  return s;
}

}  // namespace

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
    auto e = env_of(p.ranks[size_t(r)]);
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
  auto e3 = env_of(p.ranks[3]);
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
  auto e = env_of(p.ranks[1]);
  CHECK(e["OMP_NUM_THREADS"] == "1");
  CHECK(e["ROLE_NAME"] == "default");
  CHECK(e["GROUP_WORLD_SIZE"] == "1");
  CHECK(e["TORCHELASTIC_ERROR_FILE"] == "/runs/x/rank-1.error.json");
  s.run.env.emplace_back("OMP_NUM_THREADS", "4");
  CHECK(env_of(plan::make_plan(s, in).ranks[0])["OMP_NUM_THREADS"] == "4");
  s.cluster.nprocs = 1;
  s.run.env.clear();
  CHECK(env_of(plan::make_plan(s, in).ranks[0]).count("OMP_NUM_THREADS") == 0);
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
  auto e = env_of(plan::make_plan(s, inputs()).ranks[0]);
  CHECK(e["NCCL_DEBUG"] == "INFO");
  CHECK(e["NCCL_ALGO"] == "Tree");
  CHECK(e["X"] == "a b 'c' $d `e`\nf");
  CHECK(e["RANK"] == "0");  // forwarding RANK cannot break the contract
  CHECK(e.count("HOME") == 0);
}

TEST_CASE("plan: the user's interface choice stands") {
  auto s = job();
  s.run.env = {{"NCCL_SOCKET_IFNAME", "eth1"}};
  auto e = env_of(plan::make_plan(s, inputs()).ranks[0]);
  CHECK(e["NCCL_SOCKET_IFNAME"] == "eth1");
  CHECK(e["GLOO_SOCKET_IFNAME"] == "lo");
}

TEST_CASE("plan: GPUs per rank, shared GPUs, filtered slots") {
  auto s = job();
  s.cluster.nprocs = 2;
  s.gpus.per_proc = 2;
  auto p = plan::make_plan(s, inputs());
  CHECK(env_of(p.ranks[0])["CUDA_VISIBLE_DEVICES"] == "0,1");
  CHECK(env_of(p.ranks[1])["CUDA_VISIBLE_DEVICES"] == "2,3");

  auto sh = job();
  sh.cluster.nprocs = 4;
  sh.gpus.procs_per_gpu = 2;
  auto q = plan::make_plan(sh, inputs());
  CHECK(env_of(q.ranks[1])["CUDA_VISIBLE_DEVICES"] == "0");
  CHECK(env_of(q.ranks[2])["CUDA_VISIBLE_DEVICES"] == "1");

  auto f = job();
  f.cluster.hosts = {"a:4"};
  f.cluster.include = "a:1,3";
  f.gpus.per_proc = 1;
  auto r = plan::make_plan(f, inputs());
  REQUIRE(r.ranks.size() == 2);
  CHECK(env_of(r.ranks[0])["CUDA_VISIBLE_DEVICES"] == "1");
  CHECK(env_of(r.ranks[1])["CUDA_VISIBLE_DEVICES"] == "3");
}

TEST_CASE("plan: PS mode variables") {
  auto s = job();
  s.cluster.hosts = {"a:2,b:2"};
  s.comm.mode = "ps";
  auto p = plan::make_plan(s, inputs());
  auto e = env_of(p.ranks[3]);
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
  CHECK(env_of(p.ranks[1])["TORCHELASTIC_RESTART_COUNT"] == "2");
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
