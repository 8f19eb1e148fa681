// Test support: a fresh folder under /tmp for one test case, removed at its end, and the same
// with MLTRAIN_HOME pointed at it (records, state); a file's lines. One definition for every unit test file.
#pragma once

#include <doctest/doctest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>
#include <vector>

namespace mltrain::testing {

class TempDir {
 public:
  explicit TempDir(const std::string& what = "test") {
    std::string tmpl = "/tmp/mltrain-" + what + "-XXXXXX";
    REQUIRE(::mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  // Writes `text` to `rel` inside the folder (creating its folders); returns the file's path.
  std::string write(const std::string& rel, const std::string& text) const {
    std::filesystem::path p = path / rel;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p) << text;
    return p.string();
  }
  std::string str() const { return path.string(); }

  std::filesystem::path path;
};

// A TempDir that is MLTRAIN_HOME for as long as it lives.
class TempHome : public TempDir {
 public:
  explicit TempHome(const std::string& what = "home") : TempDir(what) {
    ::setenv("MLTRAIN_HOME", path.c_str(), 1);
  }
  ~TempHome() { ::unsetenv("MLTRAIN_HOME"); }
};

// The lines of a file, without their newlines.
inline std::vector<std::string> lines_of(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

}  // namespace mltrain::testing
