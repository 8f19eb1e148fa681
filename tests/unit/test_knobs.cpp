#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <type_traits>
#include <vector>

#include "knobs/gpu_library.h"
#include "knobs/knobs.h"
#include "knobs/parse.h"
#include "knobs/registry.h"

using namespace mltrain::knobs;
using std::chrono::milliseconds;

TEST_CASE("knobs: durations") {
  CHECK(parse_duration("5m") == milliseconds(300000));
  CHECK(parse_duration("90s") == milliseconds(90000));
  CHECK(parse_duration("1h30m") == milliseconds(5400000));
  CHECK(parse_duration("500ms") == milliseconds(500));
  CHECK(parse_duration("1.5m") == milliseconds(90000));
  CHECK(parse_duration("2d") == milliseconds(172800000));
  CHECK(parse_duration(" 3s ") == milliseconds(3000));
  CHECK(parse_duration("0") == milliseconds(0));
  // A bare number is seconds unless the caller names another unit.
  CHECK(parse_duration("12") == milliseconds(12000));
  CHECK(parse_duration("2.5") == milliseconds(2500));
  CHECK(parse_duration("250", milliseconds(1)) == milliseconds(250));
  for (const char* bad : {"", "s", "5x", "1h 30", "abc", "1..2s", "-3s", "-5", "10 minutes", "3s5", "5m3",
                          ".", "1e3s", "99999999999999999999h", "40000000d"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_duration(bad).has_value());
  }
}

TEST_CASE("knobs: byte sizes, integers, flags") {
  CHECK(parse_bytes("4096") == 4096u);
  CHECK(parse_bytes("64K") == 65536u);
  CHECK(parse_bytes("1M") == (1u << 20));
  CHECK(parse_bytes("256MiB") == (256u << 20));
  CHECK(parse_bytes("2g") == (2ull << 30));
  for (const char* bad : {"", "K", "-1", "1.5M", "4KB", "1 M x", "16777216T", "99999999999999999999"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_bytes(bad).has_value());
  }
  CHECK(parse_int("-3") == -3);
  CHECK(parse_int("+7") == 7);
  CHECK_FALSE(parse_int("7x").has_value());
  CHECK_FALSE(parse_int("99999999999999999999").has_value());
  CHECK_FALSE(parse_int("").has_value());
  CHECK(parse_flag("Yes") == true);
  CHECK(parse_flag("0") == false);
  CHECK_FALSE(parse_flag("maybe").has_value());
}

TEST_CASE("knobs: the registry") {
  const Knob* timeout = find("MLTRAIN_COMM_TIMEOUT");
  REQUIRE(timeout != nullptr);
  CHECK(timeout->kind == Kind::duration);
  CHECK(readers_text(timeout->readers) == "comm");
  CHECK(find("MLTRAIN_NO_SUCH_KNOB") == nullptr);
  CHECK(kind_text(*find("MLTRAIN_COMM_ALGO")) == "auto|ring|bidir|hd|direct");
  CHECK(readers_text(launcher | agent) == "launcher,agent");
  std::set<std::string_view> names;
  for (const Knob& k : all()) {
    CAPTURE(k.name);
    CHECK(names.insert(k.name).second);  // declared once
    CHECK_FALSE(k.help.empty());
    CHECK(k.readers != 0);
    // Every default parses with its own kind's parser.
    if (k.kind == Kind::duration) CHECK_NOTHROW(duration_value(k, k.default_value));
    if (k.kind == Kind::integer) CHECK_NOTHROW(int_value(k, k.default_value));
    if (k.kind == Kind::bytes) CHECK_NOTHROW(bytes_value(k, k.default_value));
    if (k.kind == Kind::choice) CHECK_NOTHROW(choice_value(k, k.default_value));
  }
}

TEST_CASE("knobs: getters read the environment and name a bad value") {
  ::unsetenv("MLTRAIN_COMM_TIMEOUT");
  CHECK(get_duration("MLTRAIN_COMM_TIMEOUT") == milliseconds(300000));
  ::setenv("MLTRAIN_COMM_TIMEOUT", "5m", 1);
  CHECK(get_duration("MLTRAIN_COMM_TIMEOUT") == milliseconds(300000));
  ::setenv("MLTRAIN_COMM_TIMEOUT", "45", 1);
  CHECK(get_duration("MLTRAIN_COMM_TIMEOUT") == milliseconds(45000));
  ::setenv("MLTRAIN_COMM_TIMEOUT", "5x", 1);
  CHECK_THROWS_WITH_AS(get_duration("MLTRAIN_COMM_TIMEOUT"),
                       "MLTRAIN_COMM_TIMEOUT='5x' is not a duration (write it like 90s, 5m, "
                       "1h30m; a bare number is seconds)",
                       BadValue);
  ::unsetenv("MLTRAIN_COMM_TIMEOUT");

  ::setenv("MLTRAIN_COMM_ALGO", "tree", 1);
  CHECK_THROWS_WITH_AS(get_choice("MLTRAIN_COMM_ALGO"),
                       "MLTRAIN_COMM_ALGO='tree' (expected auto, ring, bidir, hd or direct)", BadValue);
  ::setenv("MLTRAIN_COMM_ALGO", "", 1);  // empty reads as unset
  CHECK(get_choice("MLTRAIN_COMM_ALGO") == "auto");
  CHECK_FALSE(is_set("MLTRAIN_COMM_ALGO"));
  ::unsetenv("MLTRAIN_COMM_ALGO");

  ::setenv("MLTRAIN_COMM_SHM_BYTES", "2M", 1);
  CHECK(get_bytes("MLTRAIN_COMM_SHM_BYTES") == (2u << 20));
  ::setenv("MLTRAIN_COMM_SHM_BYTES", "lots", 1);
  CHECK_THROWS_WITH_AS(get_bytes("MLTRAIN_COMM_SHM_BYTES"),
                       doctest::Contains("MLTRAIN_COMM_SHM_BYTES='lots'"), BadValue);
  ::unsetenv("MLTRAIN_COMM_SHM_BYTES");

  CHECK_THROWS_AS(get_string("MLTRAIN_UNDECLARED"), std::logic_error);
}

// Every environment variable the sources read must be in the table (so `mltrain knobs` lists it).
TEST_CASE("knobs: every variable the sources read is declared") {
  namespace fs = std::filesystem;
  // Reads by name: getenv, knobs::get_* and is_set of "X", lookups in the launcher's environ map, and
  // the agent's reads through its environment seam (env_.get("X")).
  const std::regex read(
      R"re((?:getenv|get_string|get_int|get_duration|get_bytes|get_flag|get_choice|get_raw|is_set|environ\.find|env\.find|env_\.get)\("([A-Z][A-Z0-9_]*)"\))re");
  // knobs::x.get() and its kin: the typed accessor of the variable X (its name in lower case).
  const std::regex typed(R"re(knobs::([a-z][a-z0-9_]*)\.(?:get|is_set|raw|value_of|in|name|knob)\()re");
  std::set<std::string> found, missing;
  for (const char* dir : {"cli", "runner", "comm/src", "comm/tools", "hostfile", "profiles", "knobs"}) {
    const fs::path root = fs::path(MLTRAIN_SOURCE_DIR) / dir;
    if (!fs::exists(root)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(root)) {
      const auto ext = entry.path().extension();
      if (ext != ".cpp" && ext != ".h" && ext != ".hpp") continue;
      std::ifstream in(entry.path());
      std::stringstream text;
      text << in.rdbuf();
      const std::string s = text.str();
      for (std::sregex_iterator it(s.begin(), s.end(), read), end; it != end; ++it) {
        found.insert((*it)[1]);
        if (find((*it)[1].str()) == nullptr)
          missing.insert((*it)[1].str() + " (" + entry.path().string() + ")");
      }
      for (std::sregex_iterator it(s.begin(), s.end(), typed), end; it != end; ++it) {
        std::string name = (*it)[1];
        for (auto& c : name) c = char(std::toupper(static_cast<unsigned char>(c)));
        found.insert(name);
        if (find(name) == nullptr) missing.insert(name + " (" + entry.path().string() + ")");
      }
    }
  }
  // The scan sees the reads it must (it is not looking at an empty tree).
  CHECK(found.count("MLTRAIN_HOME") == 1);
  CHECK(found.count("MLTRAIN_COMM_TIMEOUT") == 1);
  CHECK(found.count("SLURM_JOB_NODELIST") == 1);
  for (const auto& m : missing) FAIL_CHECK("not declared in knobs/include/knobs/knobs.def: " << m);
}

TEST_CASE("gpu_library: the knob alone when set; else the loader path, then the Python's wheels") {
  namespace fs = std::filesystem;
  using mltrain::knobs::GpuLibrary;
  using mltrain::knobs::library_candidates;
  const fs::path root = fs::temp_directory_path() / ("test_knobs_wheels_" + std::to_string(::getpid()));
  const fs::path lib = root / "venv/lib/python3.12/site-packages/nvidia/nccl/lib";
  fs::create_directories(lib);
  fs::create_directories(root / "venv/bin");
  std::ofstream(lib / "libnccl.so.2") << "not a library";
  std::ofstream(root / "venv/bin/python3") << "";
  const std::string python = (root / "venv/bin/python3").string();

  auto named = library_candidates(GpuLibrary::nccl, "/x/libnccl.so.2", python);
  REQUIRE(named.size() == 1);
  CHECK(named[0].file == "/x/libnccl.so.2");
  CHECK(named[0].where == "MLTRAIN_NCCL_LIBRARY");

  auto all = library_candidates(GpuLibrary::nccl, "", python);
  REQUIRE(all.size() >= 2);
  CHECK(all.front().file == "libnccl.so.2");
  CHECK(all.front().where == "loader path");
  CHECK(all.back().file == (lib / "libnccl.so.2").string());
  CHECK(all.back().where == "python " + python);

  auto cudart = library_candidates(GpuLibrary::cudart, "", python);
  REQUIRE(cudart.size() >= 2);
  CHECK(cudart[0].file == "libcudart.so.13");
  CHECK(cudart[1].file == "libcudart.so.12");

  // A file that is no library is passed over with the loader's message.
  auto loaded = mltrain::knobs::load_library(GpuLibrary::nccl, (lib / "libnccl.so.2").string());
  CHECK(loaded.handle == nullptr);
  CHECK(!loaded.error.empty());
  fs::remove_all(root);
}

TEST_CASE("knobs: each row's accessor is its variable's name in lower case, typed by its kind") {
  std::vector<std::pair<std::string, std::string>> rows;
#define MLTRAIN_KNOB(id, name, ...) rows.emplace_back(#id, name);
#include "knobs/knobs.def"
#undef MLTRAIN_KNOB
  REQUIRE(rows.size() == all().size());
  for (size_t i = 0; i < rows.size(); ++i) {
    CAPTURE(rows[i].second);
    std::string lower = rows[i].second;
    for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    CHECK(rows[i].first == lower);
    CHECK(all()[i].name == rows[i].second);  // the table is in the rows' order
  }
  static_assert(std::is_same_v<decltype(mltrain_heartbeat_timeout.get()), milliseconds>);
  static_assert(std::is_same_v<decltype(mltrain_pull_max_bytes.get()), std::uint64_t>);
  static_assert(std::is_same_v<decltype(mltrain_comm_stats.get()), bool>);
  static_assert(std::is_same_v<decltype(master_port.get()), std::int64_t>);
  static_assert(std::is_same_v<decltype(mltrain_log.get()), std::string>);
  CHECK(mltrain_heartbeat_timeout.name() == "MLTRAIN_HEARTBEAT_TIMEOUT");
  CHECK(&home.knob() == find("HOME"));
}

TEST_CASE("knobs: typed accessors read the environment, a map, or a text, and name a bad value") {
  ::unsetenv("MLTRAIN_HEARTBEAT_TIMEOUT");
  CHECK(mltrain_heartbeat_timeout.get() == milliseconds(10000));
  CHECK_FALSE(mltrain_heartbeat_timeout.is_set());
  CHECK_FALSE(mltrain_heartbeat_timeout.raw().has_value());
  ::setenv("MLTRAIN_HEARTBEAT_TIMEOUT", "", 1);  // empty reads as unset, but is there
  CHECK(mltrain_heartbeat_timeout.get() == milliseconds(10000));
  CHECK_FALSE(mltrain_heartbeat_timeout.is_set());
  CHECK(mltrain_heartbeat_timeout.raw() == std::string());
  ::setenv("MLTRAIN_HEARTBEAT_TIMEOUT", "1m30s", 1);
  CHECK(mltrain_heartbeat_timeout.get() == milliseconds(90000));
  CHECK(mltrain_heartbeat_timeout.is_set());
  ::setenv("MLTRAIN_HEARTBEAT_TIMEOUT", "soon", 1);
  CHECK_THROWS_WITH_AS(mltrain_heartbeat_timeout.get(),
                       doctest::Contains("MLTRAIN_HEARTBEAT_TIMEOUT='soon' is not a duration"), BadValue);
  ::unsetenv("MLTRAIN_HEARTBEAT_TIMEOUT");

  CHECK(mltrain_comm_algo.value_of("hd") == "hd");
  CHECK_THROWS_AS(mltrain_comm_algo.value_of("tree"), BadValue);
  CHECK(mltrain_ps_sync.value_of("no") == false);
  CHECK(mltrain_comm_shm_bytes.value_of("2M") == (2u << 20));

  const std::map<std::string, std::string> env = {{"SLURM_JOB_ID", "42"}};
  REQUIRE(slurm_job_id.in(env) != nullptr);
  CHECK(*slurm_job_id.in(env) == "42");
  CHECK(slurm_job_nodelist.in(env) == nullptr);
}

TEST_CASE("gpu_library: the job's value, else this process's variable, else the search") {
  ::setenv("MLTRAIN_NVML_LIBRARY", "/own/libnvidia-ml.so.1", 1);
  CHECK(library_setting(GpuLibrary::nvml, "/job/libnvidia-ml.so.1") == "/job/libnvidia-ml.so.1");
  CHECK(library_setting(GpuLibrary::nvml, "") == "/own/libnvidia-ml.so.1");
  ::setenv("MLTRAIN_NVML_LIBRARY", "", 1);
  CHECK(library_setting(GpuLibrary::nvml, "").empty());
  ::unsetenv("MLTRAIN_NVML_LIBRARY");
  CHECK(library_setting(GpuLibrary::nvml, "").empty());
}

// The environment is read through knobs/ alone: a read anywhere else would be a variable that
// `mltrain knobs` does not list, with a default nobody declared.
TEST_CASE("knobs: no getenv in C++ sources outside knobs/") {
  namespace fs = std::filesystem;
  const fs::path root(MLTRAIN_SOURCE_DIR);
  // Folders that may read the environment themselves, each for its reason.
  const std::vector<std::string> allowed = {
      "knobs/",  // the registry: the one reader
      // Comparison programs built against gloo and MPI by bench/compare.sh, not part of mltrain.
      "bench/compare/",
      // Stand-ins for NCCL, CUDA and NVML: they read those libraries' own variables, as the real ones do.
      "tests/fakes/",
  };
  const std::string needle = std::string("getenv") + "(";
  std::vector<std::string> readers;
  size_t scanned = 0;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator(); ++it) {
    const fs::path& p = it->path();
    if (it->is_directory()) {
      // Build trees (a CMakeCache.txt) and hidden folders (.git) hold no source of ours.
      if (p.filename().string().front() == '.' || fs::exists(p / "CMakeCache.txt"))
        it.disable_recursion_pending();
      continue;
    }
    const auto ext = p.extension();
    if (ext != ".cpp" && ext != ".cc" && ext != ".h" && ext != ".hpp") continue;
    const std::string rel = p.lexically_relative(root).generic_string();
    if (std::any_of(allowed.begin(), allowed.end(),
                    [&](const std::string& a) { return rel.rfind(a, 0) == 0; }))
      continue;
    ++scanned;
    std::ifstream in(p);
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      const std::string code = line.substr(0, line.find("//"));  // a comment may name it
      if (code.find(needle) != std::string::npos)
        readers.push_back(rel + ":" + std::to_string(n) + ": " + line);
    }
  }
  CHECK(scanned > 100);  // the scan sees the tree
  for (const auto& r : readers) FAIL_CHECK("reads the environment outside knobs/ (use knobs/knobs.h): " << r);
}
