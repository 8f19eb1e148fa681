#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/records/cleanup.h"
#include "runner/records/records.h"
#include "runner/records/telemetry_log.h"
#include "runner/records/telemetry_view.h"
#include "runner/telemetry/analysis.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;

using mltrain::testing::TempHome;

TEST_CASE("records: save and load round trip") {
  TempHome home;
  records::RunRecord r;
  r.id = records::create_run("hello");
  CHECK(fs::is_directory(records::run_dir(r.id)));
  CHECK(records::run_dir(r.id).rfind(home.str(), 0) == 0);
  r.name = "hello";
  r.status = "failed";
  r.exit_code = 3;
  r.argv = {"python3", "train.py", "--lr=0.1"};
  r.hosts = {{"h1", "10.0.0.1", 0, "", {{"kernel", "6.1.0"}, {"torch", "2.5.1"}}},
             {"h2", "10.0.0.2", 1, "~/.cache/mltrain/work/p-1a2b3c4d@2", {{"kernel", "6.5.0"}}}};
  r.metrics = {{"loss", "lr"}, 120, 3};
  records::RankRecord rank;
  rank.rank = 1;
  rank.host = 1;
  rank.pid = 4242;
  rank.exit_code = 3;
  rank.env = {{"RANK", "1"}, {"WORLD_SIZE", "2"}};
  r.ranks = {rank};
  r.restarts = 1;
  r.max_restarts = 2;
  r.failure =
      records::Failure{1, "h2", 3, 0, "rank 1 exited with code 3", {"Traceback", "boom"}, "rank_exit"};
  CHECK(records::save(r));

  auto back = records::load(r.id);
  CHECK(back.id == r.id);
  CHECK(back.name == "hello");
  CHECK(back.status == "failed");
  CHECK(back.exit_code == 3);
  CHECK(back.argv == r.argv);
  REQUIRE(back.hosts.size() == 2);
  CHECK(back.hosts[1].address == "10.0.0.2");
  CHECK(back.hosts[1].node_rank == 1);
  // A host that ran in its own copy of the synced folder keeps it; the others the run's workdir.
  r.workdir = "~/.cache/mltrain/work/p-1a2b3c4d";
  CHECK(back.hosts[0].workdir.empty());
  CHECK(records::workdir_of(back, 1) == "~/.cache/mltrain/work/p-1a2b3c4d@2");
  REQUIRE(back.ranks.size() == 1);
  CHECK(back.ranks[0].pid == 4242);
  CHECK(back.ranks[0].env == rank.env);
  CHECK(back.restarts == 1);
  CHECK(back.max_restarts == 2);
  REQUIRE(back.failure.has_value());
  CHECK(back.failure->host == "h2");
  CHECK(back.failure->tail == std::vector<std::string>{"Traceback", "boom"});
  CHECK(back.failure->reason == "rank_exit");
  CHECK(back.metrics == r.metrics);
  CHECK(back.hosts[0].environment == r.hosts[0].environment);
  // One row per fact: one value when the hosts agree, else each value with its hosts.
  CHECK(records::environment_rows(back) ==
        std::vector<std::pair<std::string, std::string>>{{"kernel", "6.1.0 (h1); 6.5.0 (h2)"},
                                                         {"torch", "2.5.1 (h1); - (h2)"}});
}

TEST_CASE("records: listing and id lookup") {
  TempHome home;
  std::vector<std::string> ids;
  for (const char* name : {"alpha", "beta", "gamma"}) {
    records::RunRecord r;
    r.id = records::create_run(name);
    r.name = name;
    CHECK(records::save(r));
    ids.push_back(r.id);
  }
  auto runs = records::list();
  REQUIRE(runs.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(runs[i].id == ids[i]);  // oldest first
  CHECK(records::resolve("") == ids[2]);
  CHECK(records::resolve("latest") == ids[2]);
  CHECK(records::resolve(ids[0]) == ids[0]);
  CHECK(records::resolve("beta") == ids[1]);                               // a unique substring
  CHECK(records::resolve(ids[1].substr(0, ids[1].size() - 1)) == ids[1]);  // a unique prefix
  CHECK_THROWS_AS(records::resolve("no-such-run"), Error);
  // A prefix of several runs is refused, naming them newest first (one rule for every command).
  std::string message;
  try {
    records::resolve(ids[0].substr(0, 8));  // the date: every run today
  } catch (const Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("matches 3 runs") != std::string::npos);
  CHECK(message.find(ids[2]) < message.find(ids[1]));
  CHECK(message.find(ids[1]) < message.find(ids[0]));
  CHECK_THROWS_AS(records::load("no-such-run"), Error);
}

TEST_CASE("records: a new run's folder holds its run.json from the moment it exists") {
  // A launcher killed between creating the run and its first full save (Ctrl-C while the code is
  // kept) left a folder without run.json: `ls` hid it, a sweep's trial pointed at nothing.
  TempHome home;
  std::string id = records::create_run("born");
  auto r = records::load(id);
  CHECK(r.id == id);
  CHECK(r.name == "born");
  CHECK(r.status == "running");  // this process is its launcher, and it is alive
  CHECK(r.launcher_pid == ::getpid());
  CHECK(!r.started_at.empty());
  REQUIRE(records::list().size() == 1);
  CHECK(records::list()[0].id == id);
  for (const auto& e : fs::directory_iterator(records::runs_dir()))  // no staging folder left
    CHECK(e.path().filename().string() == id);
  CHECK((fs::status(records::run_dir(id)).permissions() & fs::perms::all) == fs::perms::owner_all);
}

TEST_CASE("records: a corrupt run.json is an error naming the file") {
  TempHome home;
  std::string id = records::create_run("bad");
  { std::ofstream(records::run_dir(id) + "/run.json") << "{ not json"; }
  std::string message;
  try {
    records::load(id);
  } catch (const Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("run.json") != std::string::npos);
}

TEST_CASE("records: gc picks ended runs older than the limit and beyond the newest N") {
  using namespace std::chrono;
  auto now = system_clock::from_time_t(2'000'000'000);
  auto iso = [&](hours ago) {
    std::time_t t = system_clock::to_time_t(now - ago);
    std::tm tm{};
    ::gmtime_r(&t, &tm);
    char buf[40];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S.000Z", &tm);
    return std::string(buf);
  };
  std::vector<records::RunRecord> runs(4);  // oldest first: 30 days, 10 days, 2 days, 1 hour old
  const hours ages[] = {hours(24 * 30), hours(24 * 10), hours(48), hours(1)};
  for (size_t i = 0; i < runs.size(); ++i) {
    runs[i].id = "run" + std::to_string(i);
    runs[i].status = "succeeded";
    runs[i].started_at = iso(ages[i]);
  }
  records::GcOptions o;
  o.older_than = hours(24 * 7);
  CHECK(records::gc_select(runs, o, now) == std::vector<std::string>{"run1", "run0"});
  o.keep = 3;
  CHECK(records::gc_select(runs, o, now) == std::vector<std::string>{"run0"});
  o.older_than.reset();
  o.keep = 1;
  CHECK(records::gc_select(runs, o, now) == std::vector<std::string>{"run2", "run1", "run0"});
  // A running run (its launcher alive: this process) is never picked.
  runs[0].status = "running";
  runs[0].launcher_pid = int(::getpid());
  runs[0].launcher_start = records::process_start_time(::getpid());
  CHECK(records::gc_select(runs, o, now) == std::vector<std::string>{"run2", "run1"});
}

TEST_CASE("secret: names that look secret, and MLTRAIN_SECRET_VARS") {
  for (const char* name : {"WANDB_API_KEY", "aws_secret_access_key", "HF_TOKEN", "GITHUB_TOKEN_RO",
                           "MLTRAIN_TOKEN", "DB_PASSWORD", "my_password_file", "SECRET"})
    CHECK_MESSAGE(secret::is_secret_name(name), name);
  for (const char* name : {"PATH", "KEYBOARD", "RANK", "MASTER_PORT", "PASSWD"})
    CHECK_MESSAGE(!secret::is_secret_name(name), name);
  ::setenv("MLTRAIN_SECRET_VARS", "hf_*, PASSWD", 1);
  CHECK(secret::is_secret_name("HF_LOGIN"));
  CHECK(secret::is_secret_name("passwd"));
  CHECK(secret::shown_value("HF_LOGIN", "abc") == "<secret>");
  CHECK(secret::shown_value("RANK", "3") == "3");
  ::unsetenv("MLTRAIN_SECRET_VARS");
  CHECK(!secret::is_secret_name("HF_LOGIN"));
}

TEST_CASE("records: the state home, runs/ and run folders are private, run.json 0600") {
  TempHome home;
  ::chmod(home.path.c_str(), 0755);
  mode_t old = ::umask(0);
  std::string id = records::create_run("priv");
  records::RunRecord r;
  r.id = id;
  CHECK(records::save(r));
  ::umask(old);
  auto mode = [](const std::string& p) {
    struct stat st {};
    REQUIRE(::stat(p.c_str(), &st) == 0);
    return st.st_mode & 0777;
  };
  CHECK(mode(home.path) == 0700);
  CHECK(mode(records::runs_dir()) == 0700);
  CHECK(mode(records::run_dir(id)) == 0700);
  CHECK(mode(records::run_dir(id) + "/run.json") == 0600);
}

TEST_CASE("records: a telemetry sample as one JSON line, missing values null") {
  const std::string sample =
      "MLTEL 1 t=1700000000123 mono=5000000000\n"
      "host ncpu=8 cpu=1250 l1=50 l5=25 mt=16000000000 ma=8000000000 rx=10 tx=20\n"
      "gpus src=nvml\n"
      "gpu i=0 uuid=GPU-1 u=40 mu=100 mt=40960 pw=250000 thr=4 procs=41:100,99:-\n"
      "rank r=0 pid=41 st=R cpu=9950 rss=1048576 cns=200 calls=3 cen=0 cex=4000000000 cst=1000000000\n"
      "rank r=1 pid=42 st=S\n";
  std::string error;
  std::string line = records::telemetry_json_line("h1", sample, error);
  INFO(line);
  CHECK(error.empty());
  CHECK(line.find('\n') == std::string::npos);
  CHECK(line.rfind("{\"schema\":1,\"host\":\"h1\",\"time_ms\":1700000000123,\"monotonic_ns\":5000000000,",
                   0) == 0);
  CHECK(line.find("\"cpu_percent\":12.5") != std::string::npos);
  CHECK(line.find("\"load\":[0.5,0.25,null]") != std::string::npos);
  CHECK(line.find("\"mem_available_bytes\":8000000000") != std::string::npos);
  CHECK(line.find("\"gpu_source\":\"nvml\"") != std::string::npos);
  CHECK(line.find("\"util_percent\":40") != std::string::npos);
  CHECK(line.find("\"power_limit_mw\":null,\"temperature_c\":null") != std::string::npos);
  CHECK(line.find("\"throttle_reasons\":[\"sw_power_cap\"]") != std::string::npos);
  // A GPU process is named by its rank when its pid is one of this host's ranks.
  CHECK(line.find("{\"pid\":41,\"used_mib\":100,\"rank\":0}") != std::string::npos);
  CHECK(line.find("{\"pid\":99,\"used_mib\":null,\"rank\":null}") != std::string::npos);
  CHECK(line.find("\"rank\":0,\"pid\":41,\"state\":\"R\",\"cpu_percent\":99.5,\"rss_bytes\":1048576,"
                  "\"comm_ns\":200,\"calls\":3,\"entered_ns\":0,\"last_exit_ns\":4000000000,"
                  "\"started_ns\":1000000000}") != std::string::npos);
  CHECK(line.find("\"rank\":1,\"pid\":42,\"state\":\"S\",\"cpu_percent\":null,\"rss_bytes\":null,"
                  "\"comm_ns\":null,") != std::string::npos);

  CHECK(records::telemetry_json_line("h1", "not a sample", error).empty());
  CHECK_FALSE(error.empty());

  // Read back (show and top do), it is the sample that was encoded: missing values stay missing.
  telemetry::Sample want, got;
  REQUIRE(telemetry::decode(sample, want, error));
  std::string host;
  REQUIRE_MESSAGE(records::telemetry_from_json(line, host, got, error), error);
  CHECK(host == "h1");
  CHECK(got == want);
  CHECK_FALSE(records::telemetry_from_json("{\"schema\":1}", host, got, error));
  CHECK_FALSE(records::telemetry_from_json("not json", host, got, error));
  CHECK_FALSE(records::telemetry_from_json("{\"schema\":1,\"host\":\"h\",\"time_ms\":1,\"cpus\":\"eight\"}",
                                           host, got, error));
}

TEST_CASE("records: telemetry keeps every sample for 2 minutes, then one per host every 10 s") {
  CHECK(records::keep_telemetry_sample(0, -1));
  CHECK(records::keep_telemetry_sample(1000, 0));
  CHECK(records::keep_telemetry_sample(119'999, 119'000));
  CHECK_FALSE(records::keep_telemetry_sample(120'500, 119'999));  // past 2 min: 10 s apart
  CHECK(records::keep_telemetry_sample(129'999, 119'999));
  CHECK_FALSE(records::keep_telemetry_sample(121'000, 120'500));
  CHECK_FALSE(records::keep_telemetry_sample(130'499, 120'500));
  CHECK(records::keep_telemetry_sample(130'500, 120'500));
  CHECK(records::keep_telemetry_sample(3'600'000, -1));

  // A 1-hour run sampled every second: 120 + 348 lines per host.
  int kept = 0;
  int64_t last = -1;
  for (int64_t t = 0; t < 3'600'000; t += 1000)
    if (records::keep_telemetry_sample(t, last)) ++kept, last = t;
  CHECK(kept == 468);

  // The biggest usual host, 8 ranks on 8 GPUs, every field at its widest: an hour stays under 5 MB.
  telemetry::Sample big;
  big.time_ms = 1'800'000'000'000;
  big.monotonic_ns = UINT64_MAX / 2;
  big.host = {256,           10000, 99999, 99999, 99999, UINT64_MAX / 2, UINT64_MAX / 2, UINT64_MAX / 2,
              UINT64_MAX / 2};
  big.gpu_source = "nvml";
  for (int i = 0; i < 8; ++i) {
    telemetry::GpuSample g;
    g.index = i;
    g.uuid = "GPU-4049c22c-0000-4000-8000-00000000000" + std::to_string(i);
    g.util_percent = 100, g.mem_used_mib = 81559, g.mem_total_mib = 81559, g.power_mw = 700000;
    g.power_limit_mw = 700000, g.temperature_c = 90, g.sm_clock_mhz = 1980, g.throttle_reasons = 0x1ff;
    g.processes = {{4000000u + unsigned(i), 81000}};
    big.gpus.push_back(g);
    telemetry::RankSample r;
    r.rank = 1000 + i, r.pid = 4000000 + i, r.state = 'R', r.cpu_percent_x100 = 640000,
    r.rss_bytes = UINT64_MAX / 2;
    r.comm_ns = r.entered_ns = r.last_exit_ns = r.started_ns = r.calls = UINT64_MAX / 2;
    big.ranks.push_back(r);
  }
  std::string error;
  std::string line =
      records::telemetry_json_line("gpu-node-017.cluster.example.com", telemetry::encode(big), error);
  REQUIRE(error.empty());
  INFO(line.size());
  CHECK(double(line.size() + 1) * kept < 5e6);
}

TEST_CASE("records: TelemetryLog appends kept samples to telemetry.jsonl") {
  TempHome home;
  std::string dir = home.str();
  {
    records::TelemetryLog log(dir);
    log.append("h1", "MLTEL 1 t=1\nhost ncpu=2\n", 0);
    log.append("h2", "MLTEL 1 t=2\nhost ncpu=4\n", 0);
    log.append("h1", "MLTEL 1 t=3\nhost ncpu=2\n", 700'000);
    log.append("h1", "MLTEL 1 t=4\nhost ncpu=2\n", 701'000);  // thinned away
    log.append("h1", "garbage", 800'000);                     // skipped, said once
  }
  std::ifstream in(dir + "/telemetry.jsonl");
  std::string line;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(line);
  REQUIRE(lines.size() == 3);
  CHECK(lines[0].find("\"time_ms\":1,") != std::string::npos);
  CHECK(lines[1].find("\"host\":\"h2\"") != std::string::npos);
  CHECK(lines[2].find("\"time_ms\":3,") != std::string::npos);
  // The live file holds each host's latest sample, thinned or not.
  size_t skipped = 9;
  auto live = records::read_telemetry(dir + "/" + records::kTelemetryLiveFile, &skipped);
  CHECK(skipped == 0);
  REQUIRE(live.size() == 2);
  CHECK(live[0].first == "h1");
  CHECK(live[0].second.time_ms == 4);
  CHECK(live[1].first == "h2");
  auto all = records::read_telemetry(dir + "/telemetry.jsonl", &skipped);
  CHECK(all.size() == 3);
  CHECK(records::read_telemetry(dir + "/missing.jsonl").empty());
}

TEST_CASE("records: top's screen and JSON, show's utilization, the status line") {
  const uint64_t s = 1'000'000'000;
  auto sample = [&](int64_t ms, uint64_t mono, uint64_t c0, uint64_t c1) {
    telemetry::Sample x;
    x.time_ms = ms;
    x.monotonic_ns = mono;
    x.host.cpus = 8;
    x.host.cpu_percent_x100 = 5000;
    x.host.mem_total_bytes = 16ull << 30;
    x.host.mem_available_bytes = 8ull << 30;
    telemetry::GpuSample g;
    g.index = 0;
    g.util_percent = 80;
    g.mem_used_mib = 2048;
    g.mem_total_mib = 81559;
    g.processes.push_back({41, 100});
    telemetry::GpuSample idle = g;
    idle.index = 1;
    idle.util_percent = 2;
    idle.processes = {{42, std::nullopt}};
    x.gpus = {g, idle};
    telemetry::RankSample r0, r1;
    r0.rank = 0, r0.pid = 41, r0.state = 'R', r0.comm_ns = c0, r0.calls = 10;
    r1.rank = 1, r1.pid = 42, r1.state = 'S', r1.comm_ns = c1, r1.calls = 10;
    x.ranks = {r0, r1};
    return x;
  };
  telemetry::Board b;
  b.add("h1", sample(1000, 10 * s, 0, 0));
  b.add("h1", sample(2000, 11 * s, s * 9 / 10, s / 50));
  telemetry::Snapshot snap = b.snapshot();
  REQUIRE(snap.straggler == 1);

  records::TopScreen screen;
  screen.width = 120;
  screen.title = "run r1 (running)";
  std::string text = records::render_top(snap, screen);
  INFO(text);
  CHECK(text.rfind("mltrain top - run r1 (running) - 1 host, 2 ranks, 2 GPUs\n", 0) == 0);
  CHECK(text.find("straggler: rank 1:") != std::string::npos);
  CHECK(text.find("idle GPUs (under 10% while others are over 50%): h1:1") != std::string::npos);
  CHECK(text.find("2%      0.0 1      2% <- straggler\n") != std::string::npos);
  for (size_t at = 0, nl; (nl = text.find('\n', at)) != std::string::npos; at = nl + 1) CHECK(nl - at <= 120);
  screen.view = records::TopView::ranks;
  screen.height = 4;
  screen.footer = "q quit";
  std::string ranks_only = records::render_top(snap, screen);
  CHECK(ranks_only.find("HOST             CPU") == std::string::npos);
  CHECK(std::count(ranks_only.begin(), ranks_only.end(), '\n') == 4);  // cut to the height, footer last
  CHECK(ranks_only.find("q quit\n") == ranks_only.size() - 7);

  std::string json = records::snapshot_json(snap, "r1", {{"h9", "cannot connect"}});
  CHECK(json.find("\"run\": \"r1\"") != std::string::npos);
  CHECK(json.find("\"straggler\": {\n    \"rank\": 1,") != std::string::npos);
  CHECK(json.find("\"rank\": 0\n") != std::string::npos);  // GPU 0's process is rank 0
  CHECK(json.find("\"problem\": \"cannot connect\"") != std::string::npos);

  telemetry::Summary sum =
      telemetry::summarize({{"h1", sample(1000, 10 * s, 0, 0)}, {"h1", sample(61000, 70 * s, 54 * s, s)}});
  std::string util = records::format_utilization(sum);
  INFO(util);
  CHECK(util.find("utilization (2 samples from 1 host over 1m00s)") != std::string::npos);
  CHECK(util.find("GPU util   |") != std::string::npos);
  CHECK(util.find("h1:0                  80%    80%      2.0G/79.6G  0") != std::string::npos);
  CHECK(util.find("straggler: rank 1:") != std::string::npos);
  CHECK(records::format_utilization(telemetry::Summary{}).empty());
  CHECK(records::utilization_json(sum).find("\"straggler\":{\"rank\":1,") != std::string::npos);

  CHECK(records::status_line(snap, {0, 1}, 2, 75'000) ==
        "2/2 ranks alive - 1m15s - GPU 41% - straggler: rank 1");
  CHECK(records::status_line(snap, {5}, 8, 75'000).rfind("1/8 ranks alive (5) - 1m15s", 0) == 0);
  std::vector<int> every_other;
  for (int r = 0; r < 200; r += 2) every_other.push_back(r);
  std::string many = records::status_line(snap, every_other, 200, 75'000);
  CHECK(many.rfind("100/200 ranks alive (0,2,4,6,8,10,12,14,16,\u2026) - 1m15s", 0) == 0);
  CHECK(records::human_bytes(1536) == "1.5K");
  CHECK(records::human_bytes(3ull << 30) == "3.0G");
  CHECK(records::human_bytes(512) == "512B");
}
