#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "runner/common/error.h"
#include "runner/records/records.h"

namespace fs = std::filesystem;
using namespace mltrain;

namespace {

// Points MLTRAIN_HOME at a fresh folder for one test case.
struct TempHome {
  TempHome() {
    char tmpl[] = "/tmp/mltrain-records-XXXXXX";
    path = ::mkdtemp(tmpl);
    ::setenv("MLTRAIN_HOME", path.c_str(), 1);
  }
  ~TempHome() {
    ::unsetenv("MLTRAIN_HOME");
    fs::remove_all(path);
  }
  std::string path;
};

}  // namespace

TEST_CASE("records: save and load round trip") {
  TempHome home;
  records::RunRecord r;
  r.id = records::create_run("hello");
  CHECK(fs::is_directory(records::run_dir(r.id)));
  CHECK(records::run_dir(r.id).rfind(home.path, 0) == 0);
  r.name = "hello";
  r.status = "failed";
  r.exit_code = 3;
  r.argv = {"python3", "train.py", "--lr=0.1"};
  r.hosts = {{"h1", "10.0.0.1", 0}, {"h2", "10.0.0.2", 1}};
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
  records::save(r);

  auto back = records::load(r.id);
  CHECK(back.id == r.id);
  CHECK(back.name == "hello");
  CHECK(back.status == "failed");
  CHECK(back.exit_code == 3);
  CHECK(back.argv == r.argv);
  REQUIRE(back.hosts.size() == 2);
  CHECK(back.hosts[1].address == "10.0.0.2");
  CHECK(back.hosts[1].node_rank == 1);
  REQUIRE(back.ranks.size() == 1);
  CHECK(back.ranks[0].pid == 4242);
  CHECK(back.ranks[0].env == rank.env);
  CHECK(back.restarts == 1);
  CHECK(back.max_restarts == 2);
  REQUIRE(back.failure.has_value());
  CHECK(back.failure->host == "h2");
  CHECK(back.failure->tail == std::vector<std::string>{"Traceback", "boom"});
  CHECK(back.failure->reason == "rank_exit");
}

TEST_CASE("records: listing and id lookup") {
  TempHome home;
  std::vector<std::string> ids;
  for (const char* name : {"alpha", "beta", "gamma"}) {
    records::RunRecord r;
    r.id = records::create_run(name);
    r.name = name;
    records::save(r);
    ids.push_back(r.id);
  }
  auto runs = records::list();
  REQUIRE(runs.size() == 3);
  for (size_t i = 0; i < 3; ++i) CHECK(runs[i].id == ids[i]);  // oldest first
  CHECK(records::resolve("") == ids[2]);
  CHECK(records::resolve("latest") == ids[2]);
  CHECK(records::resolve(ids[0]) == ids[0]);
  CHECK(records::resolve("beta") == ids[1]);                                     // a unique substring
  CHECK(records::resolve(ids[1].substr(0, ids[1].size() - 1), true) == ids[1]);  // a unique prefix
  CHECK_THROWS_AS(records::resolve("no-such-run"), Error);
  CHECK_THROWS_AS(records::load("no-such-run"), Error);
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
