#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "runner/transport/ssh_bootstrap.h"
#include "runner/transport/ssh_config.h"
#include "temp_dir.h"

using namespace mltrain::transport;
namespace fs = std::filesystem;

using mltrain::testing::TempDir;

namespace {

SshConfig parse(const std::string& text) { return SshConfig::parse(text, "/home/u"); }

}  // namespace

TEST_CASE("ssh config: Host patterns with * and ?") {
  auto c = parse(
      "Host gpu-*\n  User trainer\n"
      "Host node?\n  User op\n"
      "Host *\n  User fallback\n");
  CHECK(c.value("gpu-17", "user") == "trainer");
  CHECK(c.value("node3", "user") == "op");
  CHECK(c.value("node33", "user") == "fallback");  // ? is exactly one character
  CHECK(c.value("GPU-2", "user") == "trainer");    // host names have no case
  CHECK(c.value("gpu-1", "port") == "");
}

TEST_CASE("ssh config: negated patterns exclude a host") {
  auto c = parse(
      "Host * !bastion !db?\n  ProxyJump bastion\n"
      "Host a b c\n  Port 2200\n");
  CHECK(c.value("worker1", "proxyjump") == "bastion");
  CHECK(c.value("bastion", "proxyjump") == "");
  CHECK(c.value("db1", "proxyjump") == "");
  CHECK(c.value("db12", "proxyjump") == "bastion");
  CHECK(c.value("b", "port") == "2200");
  CHECK(c.value("d", "port") == "");
  // A negation alone matches nothing.
  CHECK(parse("Host !x\n  Port 1\n").value("y", "port") == "");
  CHECK(ssh_host_matches("h1", {"h*", "!h2"}));
  CHECK_FALSE(ssh_host_matches("h2", {"h*", "!h2"}));
  CHECK_FALSE(ssh_host_matches("h2", {}));
}

TEST_CASE("ssh config: the first value wins, lines before any Host apply to all") {
  auto c = parse(
      "ConnectTimeout 7\n"
      "Host h1\n  ConnectTimeout 3\n  User first\n  User second\n"
      "Host *\n  ConnectTimeout 9\n  User third\n");
  CHECK(c.value("h1", "connecttimeout") == "7");
  CHECK(c.value("h1", "user") == "first");
  CHECK(c.value("h2", "user") == "third");
}

TEST_CASE("ssh config: keywords in any case, '=' separators, comments, quoted values") {
  auto c = parse(
      "# a comment\n"
      "\n"
      "HOST h1\n"
      "  PORT=2222\n"
      "  user = alice\n"
      "  IdentityFile \"~/keys/my key\"\n"
      "\tStrictHostKeyChecking\taccept-new   \r\n"
      "  # User mallory\n"
      "  ProxyCommand ssh -W %h:%p \"jump host\"\n");
  CHECK(c.value("h1", "Port") == "2222");
  CHECK(c.value("h1", "USER") == "alice");
  CHECK(c.value("h1", "identityfile") == "~/keys/my key");
  CHECK(c.value("h1", "stricthostkeychecking") == "accept-new");
  CHECK(c.value("h1", "proxycommand") == "ssh -W %h:%p \"jump host\"");  // a command stays as written
  CHECK(parse("Host \"h 2\"\n  Port 1\n").value("h 2", "port") == "1");
}

TEST_CASE("ssh config: Match blocks") {
  auto c = parse(
      "Match host gpu*,!gpu-old\n  User g\n"
      "Match user bob\n  User never\n"
      "Match originalhost cpu1\n  Port 33\n"
      "Match all\n  User everyone\n");
  CHECK(c.value("gpu1", "user") == "g");
  CHECK(c.value("gpu-old", "user") == "everyone");
  CHECK(c.value("cpu1", "port") == "33");
  CHECK(c.value("cpu2", "port") == "");
  // Criteria mltrain cannot evaluate make the block not apply, whatever follows.
  CHECK(parse("Match exec true\n  Port 1\n").value("x", "port") == "");
  CHECK(parse("Match !host a\n  Port 1\n").value("b", "port") == "1");
  CHECK(parse("Match !host a\n  Port 1\n").value("a", "port") == "");
}

TEST_CASE("ssh config: Include, relative to ~/.ssh, with globs, in a block") {
  TempDir home;
  home.write(".ssh/config.d/10-gpu.conf", "Host gpu*\n  User trainer\n");
  home.write(".ssh/config.d/20-all.conf", "User everyone\n");
  home.write(".ssh/only-h9.conf", "Port 9999\n");
  home.write(".ssh/deep.conf", "Include deep.conf\nPort 1\n");  // includes itself: stops at a depth
  home.write("abs.conf", "Host abs\n  User absolute\n");
  auto c = SshConfig::parse(
      "Include config.d/*.conf\n"
      "Host h9\n  Include only-h9.conf\n"
      "Host loop\n  Include deep.conf\n"
      "Host *\n  Include " +
          home.str() + "/abs.conf\n  Port 22\n",
      home.path);
  CHECK(c.value("gpu1", "user") == "trainer");
  CHECK(c.value("cpu1", "user") == "everyone");
  CHECK(c.value("h9", "port") == "9999");
  CHECK(c.value("h8", "port") == "22");  // the Include under Host h9 is not read for h8
  CHECK(c.value("loop", "port") == "1");
  CHECK(c.value("abs", "user") == "everyone");  // the top-level Include came first
  // Block state returns after an Include: "Port 22" still belongs to "Host *".
  CHECK(c.value("abs", "port") == "22");
}

TEST_CASE("ssh config: load reads a file, a missing one is empty") {
  TempDir home;
  home.write("cfg", "Host h1\n  HostName 10.0.0.1\n");
  CHECK(SshConfig::load(home.str() + "/cfg", home.str()).value("h1", "hostname") == "10.0.0.1");
  CHECK(SshConfig::load(home.str() + "/none", home.str()).value("h1", "hostname") == "");
}

TEST_CASE("ssh config: ~ expansion and ProxyJump as a ProxyCommand") {
  CHECK(expand_home("~/.ssh/id_ed25519", "/home/u") == "/home/u/.ssh/id_ed25519");
  CHECK(expand_home("~", "/home/u") == "/home/u");
  CHECK(expand_home("/etc/ssh/key", "/home/u") == "/etc/ssh/key");
  CHECK(expand_home("~bob/key", "/home/u") == "~bob/key");
  CHECK(expand_home("keys/~/x", "/home/u") == "keys/~/x");
  CHECK(proxy_command_for_jump("/c/cfg", "jump") == "ssh -F '/c/cfg' -W '[%h]:%p' jump");
  CHECK(proxy_command_for_jump("/c/cfg", "Admin@j1:2222,j2") ==
        "ssh -F '/c/cfg' -W '[%h]:%p' -J Admin@j1:2222 j2");
  CHECK(proxy_command_for_jump("/c/cfg", "a,b,c") == "ssh -F '/c/cfg' -W '[%h]:%p' -J a,b c");
}

TEST_CASE("ssh bootstrap: the script uploads a missing or damaged agent, then runs it") {
  TempDir home;
  std::string agent = "#!/bin/sh\necho agent-ran\n";
  std::string hash;
  {
    std::ofstream(home.str() + "/agent") << agent;
    FILE* p = ::popen(("sha256sum < " + home.str() + "/agent").c_str(), "r");
    REQUIRE(p);
    char buf[128] = {};
    REQUIRE(std::fgets(buf, sizeof buf, p));
    ::pclose(p);
    hash = std::string(buf).substr(0, 64);
  }
  std::string script_file = home.str() + "/script.sh";
  auto run = [&](const std::string& arch, bool send_agent) {
    std::ofstream(script_file) << agent_bootstrap_script(hash, agent.size(), arch);
    std::string cmd = "HOME=" + home.str() + " sh " + script_file + " < " +
                      (send_agent ? home.str() + "/agent" : std::string("/dev/null"));
    FILE* p = ::popen(cmd.c_str(), "r");
    std::string out;
    char buf[256];
    while (std::fgets(buf, sizeof buf, p)) out += buf;
    ::pclose(p);
    return out;
  };
  std::string arch;
  {
    FILE* p = ::popen("uname -m", "r");
    char buf[64] = {};
    REQUIRE(std::fgets(buf, sizeof buf, p));
    ::pclose(p);
    arch = buf;
    arch.pop_back();
  }
  std::string cached = home.str() + "/.cache/mltrain/mltrain-agent-" + hash.substr(0, 16);
  CHECK(agent_remote_path(hash) == "\"$HOME/.cache/mltrain/mltrain-agent-" + hash.substr(0, 16) + "\"");
  CHECK(run(arch, true) == "MLTRAIN-AGENT-MISSING\nMLTRAIN-AGENT-OK\nagent-ran\n");
  CHECK(fs::exists(cached));
  CHECK(run(arch, false) == "MLTRAIN-AGENT-OK\nagent-ran\n");  // cached: nothing read
  std::ofstream(cached, std::ios::app) << "# damaged\n";
  CHECK(run(arch, true) == "MLTRAIN-AGENT-MISSING\nMLTRAIN-AGENT-OK\nagent-ran\n");
  CHECK(run("sparc64", false) == "MLTRAIN-ARCH " + arch + "\n");
}
