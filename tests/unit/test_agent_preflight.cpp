#include <doctest/doctest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "runner/agent/preflight.h"

using namespace mltrain::agent;

namespace {

// A file system holding exactly the given folders and executable files.
FileSystemView fake_fs(std::set<std::string> dirs, std::set<std::string> executables) {
  FileSystemView fs;
  fs.is_directory = [dirs](const std::string& p) { return dirs.count(p) > 0; };
  fs.is_executable_file = [executables](const std::string& p) { return executables.count(p) > 0; };
  return fs;
}

}  // namespace

TEST_CASE("agent preflight: the interface carrying the local address") {
  std::vector<InterfaceAddress> ifs = {{"lo", AF_INET, "127.0.0.1"},
                                       {"eth0", AF_INET6, "fe80::1"},
                                       {"eth0", AF_INET, "10.0.0.2"},
                                       {"eth1", AF_INET, "10.0.0.2"},
                                       {"ib0", AF_INET, "192.168.7.3"}};
  CHECK(interface_with_address(ifs, AF_INET, "10.0.0.2") == "eth0");  // the first listed wins
  CHECK(interface_with_address(ifs, AF_INET, "192.168.7.3") == "ib0");
  CHECK(interface_with_address(ifs, AF_INET6, "fe80::1") == "eth0");
  CHECK(interface_with_address(ifs, AF_INET6, "10.0.0.2") == "");  // wrong family
  CHECK(interface_with_address(ifs, AF_INET, "10.9.9.9") == "");
  CHECK(interface_with_address({}, AF_INET, "10.0.0.2") == "");
}

TEST_CASE("agent preflight: route to a loopback master goes over lo") {
  Route r = route_to("127.0.0.1");
  CHECK(r.local_ip == "127.0.0.1");
  CHECK(r.ifname == "lo");
  Route none = route_to("no-such-host.invalid");
  CHECK(none.ifname.empty());
  CHECK(none.local_ip.empty());
}

TEST_CASE("agent preflight: free ports are distinct and capped") {
  std::vector<std::string> problems;
  auto ports = reserve_free_ports(4, problems);
  CHECK(problems.empty());
  REQUIRE(ports.size() == 4);
  CHECK(std::set<std::string>(ports.begin(), ports.end()).size() == 4);
  for (const auto& p : ports) {
    CAPTURE(p);
    CHECK(std::stoi(p) > 0);
    CHECK(std::stoi(p) < 65536);
  }
  CHECK(reserve_free_ports(100, problems).size() == kMaxPreflightPorts);
  CHECK(reserve_free_ports(0, problems).empty());
  CHECK(problems.empty());
}

TEST_CASE("agent preflight: the PATH programs are looked up in") {
  CHECK(effective_path("/opt/bin", "/usr/bin") == "/opt/bin");
  CHECK(effective_path("", "/usr/local/bin:/usr/bin") == "/usr/local/bin:/usr/bin");
  CHECK(effective_path("", nullptr) == "/usr/bin:/bin");
}

TEST_CASE("agent preflight: program candidates follow execvp's lookup") {
  using V = std::vector<std::string>;
  CHECK(program_candidates("python3", "", "/usr/local/bin:/usr/bin") ==
        V{"/usr/local/bin/python3", "/usr/bin/python3"});
  // Empty entries mean the current folder, relative ones are taken from the workdir.
  CHECK(program_candidates("train", "/w", "/usr/bin::bin:") ==
        V{"/usr/bin/train", "/w/./train", "/w/bin/train", "/w/./train"});
  CHECK(program_candidates("train", "", ":bin") == V{"./train", "bin/train"});
  // With a slash: the file itself, from the workdir unless absolute; PATH plays no part.
  CHECK(program_candidates("./train.sh", "/w", "/usr/bin") == V{"/w/./train.sh"});
  CHECK(program_candidates("sub/train.sh", "", "/usr/bin") == V{"sub/train.sh"});
  CHECK(program_candidates("/opt/x/train", "/w", "/usr/bin") == V{"/opt/x/train"});
  CHECK(program_candidates("", "/w", "/usr/bin").empty());
}

TEST_CASE("agent preflight: workdir and program problems") {
  auto fs = fake_fs({"/w"}, {"/usr/bin/python3", "/w/sub/train.sh", "/w/bin/tool"});
  using V = std::vector<std::string>;
  CHECK(check_workdir_and_program("/w", "python3", "/usr/local/bin:/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("/w", "sub/train.sh", "/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("/w", "tool", "/usr/bin:bin", fs).empty());
  CHECK(check_workdir_and_program("", "", "", fs).empty());
  CHECK(check_workdir_and_program("/nope", "python3", "/usr/bin", fs) ==
        V{"workdir /nope does not exist here"});
  CHECK(check_workdir_and_program("/w", "train", "/usr/bin:/bin", fs) ==
        V{"program train not found in PATH (/usr/bin:/bin)"});
  CHECK(check_workdir_and_program("/w", "/opt/train", "/usr/bin", fs) ==
        V{"program /opt/train is not an executable file here"});
  // No workdir: a relative program with a slash is looked up as it is.
  CHECK(check_workdir_and_program("", "/w/sub/train.sh", "/usr/bin", fs).empty());
  CHECK(check_workdir_and_program("", "sub/train.sh", "/usr/bin", fs) ==
        V{"program sub/train.sh is not an executable file here"});
}

TEST_CASE("agent preflight: the real file system") {
  char tmpl[] = "/tmp/mltrain-preflight-XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  std::string dir = tmpl;
  std::string script = dir + "/run.sh", data = dir + "/data.txt";
  std::ofstream(script) << "#!/bin/sh\n";
  std::ofstream(data) << "x\n";
  REQUIRE(::chmod(script.c_str(), 0755) == 0);
  auto fs = real_file_system();
  CHECK(fs.is_directory(dir));
  CHECK_FALSE(fs.is_directory(script));
  CHECK(fs.is_executable_file(script));
  CHECK_FALSE(fs.is_executable_file(data));
  CHECK_FALSE(fs.is_executable_file(dir));  // a folder is not a program
  CHECK(check_workdir_and_program(dir, "./run.sh", "", fs).empty());
  CHECK(check_workdir_and_program(dir, "run.sh", ".", fs).empty());
  CHECK(check_workdir_and_program(dir, "./data.txt", "", fs) ==
        std::vector<std::string>{"program ./data.txt is not an executable file here"});
  ::unlink(script.c_str());
  ::unlink(data.c_str());
  ::rmdir(dir.c_str());
}
