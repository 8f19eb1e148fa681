#include <doctest/doctest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "runner/common/text.h"
#include "runner/transport/ssh_bootstrap.h"
#include "runner/transport/ssh_config.h"
#include "temp_dir.h"

using namespace mltrain::transport;
namespace fs = std::filesystem;

using mltrain::testing::TempDir;
using namespace std::string_view_literals;

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

TEST_CASE("ssh config: IdentityFile adds up: every value that applies, in order") {
  auto c = parse(
      "IdentityFile ~/.ssh/all\n"
      "Host h1\n  IdentityFile ~/.ssh/one\n  IdentityFile \"~/.ssh/two keys\"\n"
      "Host *\n  IdentityFile ~/.ssh/star\n");
  CHECK(c.values("h1", "IdentityFile") ==
        std::vector<std::string>{"~/.ssh/all", "~/.ssh/one", "~/.ssh/two keys", "~/.ssh/star"});
  CHECK(c.values("h2", "identityfile") == std::vector<std::string>{"~/.ssh/all", "~/.ssh/star"});
  CHECK(c.values("h2", "user").empty());
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

namespace {

std::string run_shell(const std::string& cmd) {
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p);
  std::string out;
  char buf[256];
  while (std::fgets(buf, sizeof buf, p)) out += buf;
  ::pclose(p);
  return out;
}

std::string first_line(const std::string& cmd) {
  std::string out = run_shell(cmd);
  return out.substr(0, out.find('\n'));
}

bool executable(const std::string& p) { return ::access(p.c_str(), X_OK) == 0; }

// A fake agent (a script) and its hash, the host's arch, and the bootstrap command run through a
// login shell with HOME in a temp folder, as sshd would.
struct Bootstrap {
  TempDir home{"bootstrap"};
  std::string agent = "#!/bin/sh\necho agent-ran\n";
  std::string hash, arch, cached;

  Bootstrap() {
    std::string file = home.write("agent", agent);
    hash = first_line("sha256sum < " + file).substr(0, 64);
    arch = first_line("uname -m");
    cached = home.str() + "/.cache/mltrain/mltrain-agent-" + hash.substr(0, 16);
  }
  // Runs the start command with `shell -c`, the agent on stdin when `send_agent`; PATH as given.
  std::string run(const std::string& shell, bool send_agent, const std::string& for_arch = {},
                  const std::string& path = {}) {
    std::string cmd = agent_start_command(hash, agent.size(), for_arch.empty() ? arch : for_arch);
    std::string file = home.write("command", cmd);
    return run_shell("HOME=" + home.str() + (path.empty() ? "" : " PATH=" + path) + " " + shell +
                     " -c \"$(cat " + file + ")\" < " + (send_agent ? home.str() + "/agent" : "/dev/null") +
                     " 2>&1");
  }
  // Overwrites the cached agent with as many other bytes: a size check cannot tell.
  void damage_same_size() {
    std::string bad = agent;
    bad[bad.size() - 3] = 'X';
    std::ofstream(cached, std::ios::trunc) << bad;
  }
};

const std::string kUploaded = "\nMLTRAIN-AGENT-MISSING\nMLTRAIN-AGENT-OK\nagent-ran\n";
const std::string kCached = "\nMLTRAIN-AGENT-OK\nagent-ran\n";

}  // namespace

TEST_CASE("ssh bootstrap: the script uploads a missing or damaged agent, then runs it") {
  Bootstrap b;
  CHECK(agent_remote_path(b.hash) == "\"$HOME/.cache/mltrain/mltrain-agent-" + b.hash.substr(0, 16) + "\"");
  CHECK(b.run("/bin/sh", true) == kUploaded);
  CHECK(fs::exists(b.cached));
  CHECK(b.run("/bin/sh", false) == kCached);  // cached: nothing read
  std::ofstream(b.cached, std::ios::app) << "# damaged\n";
  CHECK(b.run("/bin/sh", true) == kUploaded);
  b.damage_same_size();
  CHECK(b.run("/bin/sh", true) == kUploaded);
  CHECK(b.run("/bin/sh", false, "sparc64") == "\nMLTRAIN-ARCH " + b.arch + "\n");
}

TEST_CASE("ssh bootstrap: every common login shell runs the command as sh would") {
  std::string script = agent_bootstrap_script(std::string(64, 'a'), 1234, "x86_64");
  // What csh and fish read differently from sh inside single quotes.
  CHECK(script.find_first_of("'\\!\n") == std::string::npos);
  CHECK(agent_start_command(std::string(64, 'a'), 1234, "x86_64") == "exec /bin/sh -c '" + script + "'");
  for (const char* shell :
       {"/bin/sh", "/bin/bash", "/bin/dash", "/usr/bin/zsh", "/usr/bin/fish", "/bin/tcsh"}) {
    if (!executable(shell)) continue;  // scripts/setup.sh --test-deps installs them
    CAPTURE(shell);
    Bootstrap b;
    CHECK(b.run(shell, true) == kUploaded);
    CHECK(b.run(shell, false) == kCached);
    CHECK(b.run(shell, false, "sparc64") == "\nMLTRAIN-ARCH " + b.arch + "\n");
  }
}

TEST_CASE("ssh bootstrap: the start command's quoting reads alike in every shell") {
  CHECK(mltrain::text::shell_quote("") == "''");
  CHECK(mltrain::text::shell_quote("a b $HOME") == "'a b $HOME'");
  CHECK(mltrain::text::shell_quote("it's") == "'it'\\''s'");
  for (const char* shell : {"/bin/sh", "/bin/bash", "/usr/bin/zsh", "/usr/bin/fish", "/bin/tcsh"}) {
    if (!executable(shell)) continue;
    CAPTURE(shell);
    std::string cmd = "exec /bin/sh -c " +
                      mltrain::text::shell_quote("printf '%s|' \"$0\" 'it''s' $((1+2)) \"a  b\"") + " x0";
    TempDir d;
    std::string file = d.write("cmd", cmd);
    CHECK(run_shell(std::string(shell) + " -c \"$(cat " + file + ")\"") == "x0|its|3|a  b|");
  }
}

TEST_CASE("ssh bootstrap: without sha256sum, another tool verifies the cached agent, or it is uploaded") {
  // PATH holds what the script needs and at most one digest tool.
  TempDir bin{"bin"};
  auto link_tools = [&](const std::string& dir, std::vector<std::string> tools) {
    fs::create_directories(dir);
    for (const char* t : {"uname", "head", "chmod", "mv", "mkdir", "rm", "cat"}) tools.push_back(t);
    for (auto& t : tools) {
      std::string where = first_line("PATH=/usr/bin:/bin command -v " + t);
      if (!where.empty()) fs::create_symlink(where, dir + "/" + t);
    }
  };
  struct Tool {
    std::string name;
    std::vector<std::string> links;
  };
  for (const Tool& tool : {Tool{"shasum", {"shasum", "perl"}}, Tool{"openssl", {"openssl"}},
                           Tool{"python3", {"python3"}}, Tool{"none", {}}}) {
    CAPTURE(tool.name);
    if (!tool.links.empty() && first_line("PATH=/usr/bin:/bin command -v " + tool.links[0]).empty()) continue;
    std::string dir = bin.str() + "/" + tool.name;
    link_tools(dir, tool.links);
    Bootstrap b;
    CHECK(b.run("/bin/sh", true, {}, dir) == kUploaded);
    // A host with no digest tool cannot trust its copy: it takes the agent every time.
    CHECK(b.run("/bin/sh", tool.name == "none", {}, dir) == (tool.name == "none" ? kUploaded : kCached));
    b.damage_same_size();
    CHECK(b.run("/bin/sh", true, {}, dir) == kUploaded);
    std::ifstream in(b.cached);
    CHECK(std::string(std::istreambuf_iterator<char>(in), {}) == b.agent);
  }
}

TEST_CASE("ssh bootstrap: a cache folder it cannot make says so") {
  Bootstrap b;
  b.home.write(".cache", "a file where the folder should be");
  std::string out = b.run("/bin/sh", true);
  CHECK(out.rfind("\nMLTRAIN-AGENT-MISSING\n", 0) == 0);
  CHECK(out.find("Not a directory") != std::string::npos);  // mkdir's reason, on stderr
  CHECK(out.substr(out.size() - 22) == "MLTRAIN-UPLOAD-FAILED\n");
}

TEST_CASE("ssh bootstrap: the marker scanner skips banners and keeps the agent's stream exact") {
  SUBCASE("banner lines, and one without its newline, before the marker") {
    MarkerScanner s;
    CHECK_FALSE(s.feed("Welcome to the cluster!\nno newline here"));
    CHECK(s.skipped() == "Welcome to the cluster!\nno newline here");
    CHECK(s.feed("\nMLTRAIN-AGENT-OK\n\x01\x02\nbinary\0rest"sv));
    CHECK(s.marker() == kMarkerAgentOk);
    CHECK(s.rest() == "\x01\x02\nbinary\0rest"sv);
    CHECK(s.skipped() == "Welcome to the cluster!\nno newline here\n");
    CHECK(s.feed("more"));
    CHECK(s.rest() == "\x01\x02\nbinary\0restmore"sv);
  }
  SUBCASE("fed a byte at a time") {
    MarkerScanner s;
    std::string in = "banner\nMLTRAIN-ARCH aarch64\ntail";
    size_t i = 0;
    while (i < in.size() && !s.feed(in.substr(i, 1))) ++i;
    CHECK(s.marker() == "MLTRAIN-ARCH aarch64");
    CHECK(i == in.find("tail") - 1);
  }
  SUBCASE("a marker inside a line, or a line that only begins like one, is not a marker") {
    MarkerScanner s;
    CHECK_FALSE(s.feed("say MLTRAIN-AGENT-OK\nMLTRAIN-AGENT-OKAY\nMLTRAIN-AGENT-MISSING \n"));
    CHECK(s.feed("MLTRAIN-AGENT-MISSING\n"));
    CHECK(s.marker() == kMarkerAgentMissing);
    CHECK(s.rest().empty());
  }
  SUBCASE("a huge banner line is dropped, even where it ends like a marker") {
    MarkerScanner s;
    CHECK_FALSE(s.feed(std::string(1000, 'x')));
    CHECK_FALSE(s.feed("MLTRAIN-AGENT-OK\n"));
    CHECK(s.feed("MLTRAIN-UPLOAD-FAILED\n"));
    CHECK(s.marker() == kMarkerUploadFailed);
  }
  SUBCASE("what it skipped is kept up to 64 KiB") {
    MarkerScanner s;
    for (int i = 0; i < 2000; ++i) CHECK_FALSE(s.feed(std::string(99, 'b') + "\n"));
    CHECK(s.skipped().size() == MarkerScanner::kMaxSkipped);
    CHECK_FALSE(s.skipped_all());
    CHECK(s.feed("MLTRAIN-AGENT-OK\n"));
  }
  CHECK(is_bootstrap_marker(kMarkerNoExec));
  CHECK_FALSE(is_bootstrap_marker(""));
}
