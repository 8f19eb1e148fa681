#include <doctest/doctest.h>
#include <stdlib.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

#include "profiles/profiles.h"
#include "runner/common/error.h"
#include "runner/spec/spec.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using namespace mltrain;

using mltrain::testing::TempDir;

TEST_CASE("profiles: built-in profiles load by name") {
  for (const char* name : {"local", "cpu-cluster", "nccl-ethernet"}) {
    CAPTURE(name);
    auto p = profiles::find(name, "/nonexistent");
    REQUIRE(p.has_value());
    CHECK(p->name == name);
    CHECK(p->origin == std::string("built-in:") + name);
    CHECK(p->text.find("[") != std::string::npos);
    auto all = profiles::available();
    CHECK(std::find(all.begin(), all.end(), name) != all.end());
  }
  CHECK_FALSE(profiles::find("no-such-profile", "/nonexistent").has_value());
}

TEST_CASE("profiles: a user profile by path, and by name from the config dir") {
  TempDir d;
  std::string file = d.write("team/base.toml", "[run]\nmax_restarts = 3\n");
  auto by_rel = profiles::find("team/base.toml", d.path);
  REQUIRE(by_rel.has_value());
  CHECK(by_rel->origin == file);
  CHECK(by_rel->text == "[run]\nmax_restarts = 3\n");
  auto by_abs = profiles::find(file, "/elsewhere");
  REQUIRE(by_abs.has_value());
  CHECK(by_abs->text == by_rel->text);
  CHECK_FALSE(profiles::find("team/missing.toml", d.path).has_value());

  d.write("config/mltrain/profiles/local.toml", "[run]\nmax_restarts = 9\n");
  ::setenv("XDG_CONFIG_HOME", (d.path / "config").c_str(), 1);
  auto user = profiles::find("local", d.path);  // the user's wins over the built-in
  auto all = profiles::available();
  ::unsetenv("XDG_CONFIG_HOME");
  REQUIRE(user.has_value());
  CHECK(user->text == "[run]\nmax_restarts = 9\n");
  CHECK(std::find(all.begin(), all.end(), "local") != all.end());
}

TEST_CASE("profiles: a bad profile is an error naming it") {
  TempDir d;
  d.write("broken.toml", "[run\nmax_restarts = 3\n");
  std::string job = d.write("job.toml", "profile = 'broken.toml'\n[run]\ncommand = 'true'\n");
  std::string message;
  try {
    spec::load_file(job);
  } catch (const Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("broken.toml") != std::string::npos);

  std::string missing = d.write("job2.toml", "profile = 'nope-nope'\n[run]\ncommand = 'true'\n");
  message.clear();
  try {
    spec::load_file(missing);
  } catch (const Error& e) {
    message = e.what();
  }
  CAPTURE(message);
  CHECK(message.find("nope-nope") != std::string::npos);
}
