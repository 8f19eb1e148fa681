#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "hostfile/hostfile.h"

using namespace mltrain::hostfile;

namespace {

// The message of the ParseError `f` throws; fails the test when it throws nothing or something else.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ParseError& e) {
    return e.what();
  } catch (const std::exception& e) {
    FAIL("expected ParseError, got another exception: " << e.what());
    return {};
  }
  FAIL("expected ParseError, nothing was thrown");
  return {};
}

std::string hostfile_error(const std::string& text) {
  return error_of([&] { parse_hostfile(text, "hosts.txt"); });
}

std::string list_error(const std::string& list) {
  return error_of([&] { parse_host_list(list, "-H"); });
}

std::vector<std::string> names_of(const std::vector<Host>& hosts) {
  std::vector<std::string> names;
  for (const auto& h : hosts) names.push_back(h.name);
  return names;
}

// A temporary directory per test, removed afterwards.
struct TempDir {
  std::filesystem::path path;
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "test_hostfile.XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_SUITE("hostfile formats") {
  TEST_CASE("DeepSpeed / Open MPI line with slots and max_slots") {
    auto hosts = parse_hostfile("worker-1 slots=4 max_slots=8\n", "hosts.txt");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].name == "worker-1");
    CHECK(hosts[0].user == "");
    CHECK(hosts[0].port == 0);
    CHECK(hosts[0].slots == 4);
    CHECK(hosts[0].max_slots == 8);
    CHECK(hosts[0].slot_ids.empty());
    CHECK(hosts[0].origin == "hosts.txt:1");
  }

  TEST_CASE("bare host has no slots and counts as one") {
    auto hosts = parse_hostfile("node7\n", "hosts.txt");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].name == "node7");
    CHECK(hosts[0].slots == 0);
    CHECK(slot_count(hosts[0]) == 1);
  }

  TEST_CASE("Open MPI spellings: max-slots alias and blanks around '='") {
    auto hosts = parse_hostfile("a max-slots=8 slots=2\nb slots = 3\n", "h");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[0].slots == 2);
    CHECK(hosts[0].max_slots == 8);
    CHECK(hosts[1].name == "b");
    CHECK(hosts[1].slots == 3);
  }

  TEST_CASE("Horovod host:N with user and max_slots") {
    auto hosts = parse_hostfile("alice@gpu1:8 max_slots=16\n", "h");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].user == "alice");
    CHECK(hosts[0].name == "gpu1");
    CHECK(hosts[0].slots == 8);
    CHECK(hosts[0].max_slots == 16);
    CHECK(hosts[0].port == 0);
  }

  TEST_CASE("Horovod comma list on one line") {
    auto hosts = parse_hostfile("a:2, b:4,c\n", "h");
    REQUIRE(hosts.size() == 3);
    CHECK(names_of(hosts) == std::vector<std::string>{"a", "b", "c"});
    CHECK(hosts[0].slots == 2);
    CHECK(hosts[1].slots == 4);
    CHECK(hosts[2].slots == 0);
    CHECK(hosts[2].origin == "h:1");
  }

  TEST_CASE("ssh:// URL gives the port; slots come from slots=") {
    auto hosts = parse_hostfile("ssh://bob@login.example.com:2222 slots=4\nssh://plain\n", "h");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[0].user == "bob");
    CHECK(hosts[0].name == "login.example.com");
    CHECK(hosts[0].port == 2222);
    CHECK(hosts[0].slots == 4);
    CHECK(hosts[1].name == "plain");
    CHECK(hosts[1].port == 0);
    CHECK(hosts[1].user == "");
  }

  TEST_CASE("port= attribute") {
    auto hosts = parse_hostfile("h port=2200 slots=2", "h");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].port == 2200);
    CHECK(hosts[0].slots == 2);
  }

  TEST_CASE("IPv6 in brackets, with slots, port and zone") {
    auto hosts = parse_hostfile(
        "[fe80::1]:4\n"
        "[::1] slots=2\n"
        "ssh://root@[2001:db8::7]:2022 slots=1\n"
        "[fe80::2%eth0]:2\n",
        "h");
    REQUIRE(hosts.size() == 4);
    CHECK(hosts[0].name == "fe80::1");
    CHECK(hosts[0].slots == 4);
    CHECK(hosts[1].name == "::1");
    CHECK(hosts[1].slots == 2);
    CHECK(hosts[2].name == "2001:db8::7");
    CHECK(hosts[2].user == "root");
    CHECK(hosts[2].port == 2022);
    CHECK(hosts[2].slots == 1);
    CHECK(hosts[3].name == "fe80::2%eth0");
  }

  TEST_CASE("IPv4 addresses and fully qualified names") {
    auto hosts = parse_hostfile("10.0.0.1 slots=2\n192.168.1.255:1\nnode_1.cluster.local.\n", "h");
    CHECK(names_of(hosts) == std::vector<std::string>{"10.0.0.1", "192.168.1.255", "node_1.cluster.local."});
  }

  TEST_CASE("comments, blank lines, CRLF, tabs and a BOM are tolerated") {
    std::string text =
        "\xEF\xBB\xBF# cluster A\r\n"
        "\r\n"
        "   \t\n"
        "gpu1 slots=8   # the big one\r\n"
        "\tgpu2\tslots=4\r\n"
        "gpu3:2#no space before the comment\n"
        "# the end";
    auto hosts = parse_hostfile(text, "hosts.txt");
    REQUIRE(hosts.size() == 3);
    CHECK(hosts[0].name == "gpu1");
    CHECK(hosts[0].slots == 8);
    CHECK(hosts[0].origin == "hosts.txt:4");
    CHECK(hosts[1].name == "gpu2");
    CHECK(hosts[1].slots == 4);
    CHECK(hosts[1].origin == "hosts.txt:5");
    CHECK(hosts[2].name == "gpu3");
    CHECK(hosts[2].slots == 2);
    CHECK(hosts[2].origin == "hosts.txt:6");
  }

  TEST_CASE("empty and comment-only hostfiles give no hosts") {
    CHECK(parse_hostfile("", "h").empty());
    CHECK(parse_hostfile("# nothing\n\n", "h").empty());
  }

  TEST_CASE("Slurm ranges on a hostfile line share the line's attributes") {
    auto hosts = parse_hostfile("gpu[01-03] slots=8\n", "h");
    REQUIRE(hosts.size() == 3);
    CHECK(names_of(hosts) == std::vector<std::string>{"gpu01", "gpu02", "gpu03"});
    for (const auto& h : hosts) {
      CHECK(h.slots == 8);
      CHECK(h.origin == "h:1");
    }
  }

  TEST_CASE("same name with another user or port is another host") {
    auto hosts = parse_hostfile("h\nroot@h\nh port=2222\n", "h");
    CHECK(hosts.size() == 3);
  }

  TEST_CASE("slot_count") {
    Host h;
    CHECK(slot_count(h) == 1);
    h.slots = 6;
    CHECK(slot_count(h) == 6);
    h.slot_ids = {1, 3};
    CHECK(slot_count(h) == 2);
  }
}

TEST_SUITE("hostfile errors") {
  struct Bad {
    const char* text;      // one hostfile (the bad line last)
    const char* location;  // "hosts.txt:line:col:"
    const char* says;      // part of the message naming what is wrong
  };

  TEST_CASE("every malformed line gives one located line naming the problem") {
    const std::vector<Bad> cases = {
        {"gpu1 slots=x", "hosts.txt:1:12:", "bad slot count 'x'"},
        {"gpu1 slots=0", "hosts.txt:1:12:", "bad slot count '0'"},
        {"gpu1 slots=-2", "hosts.txt:1:12:", "bad slot count '-2'"},
        {"gpu1 slots=+2", "hosts.txt:1:12:", "bad slot count '+2'"},
        {"gpu1 slots=2.5", "hosts.txt:1:12:", "bad slot count '2.5'"},
        {"gpu1:99999999999999999999", "hosts.txt:1:6:", "bad slot count"},
        {"gpu1 slots=70000", "hosts.txt:1:12:", "bad slot count '70000'"},
        {"gpu1 slots=", "hosts.txt:1:12:", "missing value for 'slots'"},
        {"ok\ngpu1 slot=4", "hosts.txt:2:6:", "unknown key 'slot'"},
        {"gpu1 slots=4 max_slots=2", "hosts.txt:1:24:", "max_slots 2 is less than slots 4"},
        {"gpu1 slots=4 slots=5", "hosts.txt:1:14:", "'slots' given twice"},
        {"gpu1:4 slots=4", "hosts.txt:1:8:", "slot count given twice"},
        {"ssh://h:22 port=22", "hosts.txt:1:12:", "port given twice"},
        {"h port=0", "hosts.txt:1:8:", "bad port '0'"},
        {"h port=65536", "hosts.txt:1:8:", "bad port '65536'"},
        {"ssh://h:", "hosts.txt:1:9:", "missing port after ':'"},
        {"gpu1:", "hosts.txt:1:6:", "missing slot count after ':'"},
        {"gpu1 gpu2", "hosts.txt:1:6:", "expected key=value after the host, got 'gpu2'"},
        {"slots=4", "hosts.txt:1:1:", "missing host name"},
        {"h =4", "hosts.txt:1:3:", "missing key before '='"},
        {"@gpu1", "hosts.txt:1:1:", "missing user name before '@'"},
        {"bob@", "hosts.txt:1:5:", "missing host name"},
        {"a@b@c", "hosts.txt:1:4:", "more than one '@'"},
        {"b*b@h", "hosts.txt:1:2:", "bad character '*' in user name"},
        {"-oProxyCommand", "hosts.txt:1:1:", "starts with '-'"},
        {"gpu/1", "hosts.txt:1:4:", "bad character '/' in host name"},
        {"a..b", "hosts.txt:1:3:", "empty label in host name"},
        {"10.0.0.300", "hosts.txt:1:8:", "bad IPv4 address '10.0.0.300'"},
        {"010.0.0.1", "hosts.txt:1:1:", "bad IPv4 address"},
        {"10.0.1", "hosts.txt:1:1:", "bad IPv4 address"},
        {"10.0.0.1.5", "hosts.txt:1:10:", "bad IPv4 address '10.0.0.1.5'"},
        {"a.xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
         "hosts.txt:1:3:", "label longer than 63 characters"},
        {"fe80::1 slots=2", "hosts.txt:1:1:", "IPv6 address 'fe80::1' without brackets"},
        {"[fe80::zz]:2", "hosts.txt:1:2:", "bad IPv6 address 'fe80::zz'"},
        {"[::1", "hosts.txt:1:1:", "missing ']'"},
        {"[::1]x", "hosts.txt:1:6:", "unexpected 'x' after ']'"},
        {"[1-4] slots=2", "hosts.txt:1:2:", "a Slurm range needs a prefix"},
        {"a:1:2", "hosts.txt:1:4:", "unexpected second ':'"},
        {"http://h", "hosts.txt:1:1:", "unsupported scheme 'http://'"},
        {"a slots=2, b", "hosts.txt:1:3:", "key=value in a comma list"},
        {"a:2,,b", "hosts.txt:1:5:", "empty item in list"},
        {"gpu[1-2", "hosts.txt:1:4:", "missing ']'"},
        {"gpu]", "hosts.txt:1:4:", "unmatched ']'"},
        {"gpu[2-1]", "hosts.txt:1:5:", "runs backwards"},
        {"gpu[]", "hosts.txt:1:4:", "empty range '[]'"},
        {"gpu[a-b]", "hosts.txt:1:5:", "bad range 'a-b'"},
        {"x[1-100000]", "hosts.txt:1:2:", "expands to more than 65536 names"},
        {"gpu1\x01", "hosts.txt:1:5:", "unexpected control character '\\x01'"},
        {"gpu1 slots=4\nh\ngpu1 slots=2", "hosts.txt:3:1:", "duplicate host 'gpu1'"},
    };
    CHECK(cases.size() >= 20);
    for (const auto& c : cases) {
      CAPTURE(c.text);
      std::string msg = hostfile_error(c.text);
      CHECK(msg.rfind(c.location, 0) == 0);  // the message starts with file:line:col
      CHECK(msg.find(c.says) != std::string::npos);
      CHECK(msg.find('\n') == std::string::npos);
      // The offending line is quoted whole (control characters escaped).
      std::string text = c.text;
      std::string last_line = text.substr(text.rfind('\n') == std::string::npos ? 0 : text.rfind('\n') + 1);
      if (last_line.find('\x01') == std::string::npos)
        CHECK(msg.find("'" + last_line + "'") != std::string::npos);
    }
  }

  TEST_CASE("message format: location, what, quoted line, hint") {
    CHECK(hostfile_error("# header\n\ngpu1 slots=x\n") ==
          "hosts.txt:3:12: bad slot count 'x' in 'gpu1 slots=x' (expected a positive integer up to 65536)");
  }

  TEST_CASE("unknown keys suggest the closest known key") {
    CHECK(hostfile_error("h slot=4").find("(did you mean 'slots'?)") != std::string::npos);
    CHECK(hostfile_error("h maxslots=4").find("(did you mean 'max_slots'?)") != std::string::npos);
    CHECK(hostfile_error("h prot=22").find("(did you mean 'port'?)") != std::string::npos);
    std::string far = hostfile_error("h colour=red");
    CHECK(far.find("did you mean") == std::string::npos);
    CHECK(far.find("expected slots=N, max_slots=N, port=N or role=worker|server|both") != std::string::npos);
    CHECK(hostfile_error("h rol=server").find("(did you mean 'role'?)") != std::string::npos);
  }

  TEST_CASE("role= marks parameter-server hosts; worker when not given") {
    auto hosts = parse_hostfile(
        "a slots=2\nb slots=4 role=both\nc role=server\nd role=worker slots=1\n"
        "node[1-2] role=server\n",
        "hosts.txt");
    REQUIRE(hosts.size() == 6);
    CHECK(hosts[0].role == Role::worker);
    CHECK(hosts[1].role == Role::both);
    CHECK(hosts[1].slots == 4);
    CHECK(hosts[2].role == Role::server);
    CHECK(hosts[3].role == Role::worker);
    CHECK(hosts[4].role == Role::server);  // a Slurm range shares the line's keys
    CHECK(hosts[5].role == Role::server);
    CHECK(std::string(role_name(Role::both)) == "both");
    // One item in a host list may carry it too; filters keep it.
    CHECK(parse_host_list("ssh://u@h:2200 role=server", "-H")[0].role == Role::server);
    CHECK(apply_filters(hosts, "", "a")[0].role == Role::both);
  }

  TEST_CASE("a bad role names the line and the allowed values") {
    CHECK(hostfile_error("a\nb role=servr") ==
          "hosts.txt:2:8: bad role 'servr' in 'b role=servr' (did you mean 'server'? expected role=worker "
          "(ranks), role=server (parameter servers only) or role=both)");
    std::string msg = hostfile_error("b role=ps");
    CHECK(msg.rfind("hosts.txt:1:8: bad role 'ps'", 0) == 0);
    CHECK(msg.find("role=worker (ranks), role=server (parameter servers only) or role=both") !=
          std::string::npos);
    CHECK(hostfile_error("b role=").find("missing value for 'role'") != std::string::npos);
    CHECK(hostfile_error("b role=server role=both").find("'role' given twice") != std::string::npos);
    CHECK(hostfile_error("a role=server, b").find("key=value in a comma list") != std::string::npos);
  }

  TEST_CASE("a duplicate host names both lines") {
    std::string msg = hostfile_error("gpu1 slots=4\ngpu2\n\nGPU1:2\n");
    CHECK(msg.rfind("hosts.txt:4:1: duplicate host 'GPU1'", 0) == 0);
    CHECK(msg.find("first written at hosts.txt:1") != std::string::npos);
  }

  TEST_CASE("duplicates are found through Slurm expansion and IPv6 spellings") {
    std::string msg = hostfile_error("gpu02\ngpu[01-03]:8\n");
    CHECK(msg.rfind("hosts.txt:2:1:", 0) == 0);
    CHECK(msg.find("duplicate host 'gpu02'") != std::string::npos);
    CHECK(msg.find("first written at hosts.txt:1") != std::string::npos);
    CHECK(hostfile_error("[::1]\n[0:0::1]:2\n").find("first written at hosts.txt:1") != std::string::npos);
    CHECK(hostfile_error("ssh://u@h:22\nu@h port=22\n").find("duplicate host 'ssh://u@h:22'") !=
          std::string::npos);
  }

  TEST_CASE("huge and binary lines still give one short line") {
    std::string line(100000, 'a');
    std::string msg = hostfile_error(line);
    CHECK(msg.rfind("hosts.txt:1:1: host name too long", 0) == 0);
    CHECK(msg.size() < 400);
    std::string binary("h\0st", 4);
    msg = hostfile_error(binary);
    CHECK(msg.rfind("hosts.txt:1:2: unexpected control character '\\x00'", 0) == 0);
    CHECK(msg.find('\0') == std::string::npos);
    msg = hostfile_error("h\xc3\xa9");
    CHECK(msg.find("bad character '\\xc3'") != std::string::npos);
  }

  TEST_CASE("a lone carriage return in the middle of a line is refused") {
    CHECK(hostfile_error("a\rb slots=2\n").rfind("hosts.txt:1:2: unexpected control character '\\x0d'", 0) ==
          0);
  }
}

TEST_SUITE("load_hostfile") {
  TEST_CASE("reads a file and names it in origins") {
    TempDir dir;
    auto path = (dir.path / "hosts.txt").string();
    std::ofstream(path) << "a slots=2\nb:4\n";
    auto hosts = load_hostfile(path);
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[1].origin == path + ":2");
    CHECK(hosts[1].slots == 4);
  }

  TEST_CASE("errors from a loaded file carry its path") {
    TempDir dir;
    auto path = (dir.path / "bad.txt").string();
    std::ofstream(path) << "a\nb slots=0\n";
    std::string msg = error_of([&] { load_hostfile(path); });
    CHECK(msg.rfind(path + ":2:9: bad slot count '0'", 0) == 0);
  }

  TEST_CASE("missing file and directory") {
    TempDir dir;
    auto missing = (dir.path / "hosts.txt").string();
    CHECK(error_of([&] { load_hostfile(missing); }) ==
          missing + ": cannot read hostfile: No such file or directory");
    CHECK(error_of([&] { load_hostfile(dir.path.string()); }) ==
          dir.path.string() + ": cannot read hostfile: Is a directory");
  }
}

TEST_SUITE("host lists") {
  TEST_CASE("Horovod -H list with users, IPv6 and Slurm ranges") {
    auto hosts = parse_host_list("a:2,user@b:4,[fe80::1]:2,gpu[01-03]:8", "-H");
    REQUIRE(hosts.size() == 6);
    CHECK(hosts[0].name == "a");
    CHECK(hosts[0].slots == 2);
    CHECK(hosts[1].user == "user");
    CHECK(hosts[1].name == "b");
    CHECK(hosts[1].slots == 4);
    CHECK(hosts[2].name == "fe80::1");
    CHECK(hosts[2].slots == 2);
    CHECK(names_of(hosts) == std::vector<std::string>{"a", "b", "fe80::1", "gpu01", "gpu02", "gpu03"});
    for (std::size_t i = 3; i < 6; ++i) CHECK(hosts[i].slots == 8);
    for (const auto& h : hosts) CHECK(h.origin == "-H");
  }

  TEST_CASE("blanks around items, a single item with keys, ssh:// items") {
    auto hosts = parse_host_list("  a , b:3 ", "job.toml:7");
    CHECK(names_of(hosts) == std::vector<std::string>{"a", "b"});
    CHECK(hosts[1].origin == "job.toml:7");
    hosts = parse_host_list("ssh://u@h:2200 slots=4", "-H");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].port == 2200);
    CHECK(hosts[0].slots == 4);
    hosts = parse_host_list("ssh://h1:2201,ssh://h2:2202", "-H");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[1].port == 2202);
  }

  TEST_CASE("Slurm commas inside brackets belong to the range") {
    auto hosts = parse_host_list("gpu[01,03]:4,cpu1", "-H");
    CHECK(names_of(hosts) == std::vector<std::string>{"gpu01", "gpu03", "cpu1"});
    CHECK(hosts[1].slots == 4);
    CHECK(hosts[2].slots == 0);
  }

  TEST_CASE("an empty list is no hosts") { CHECK(parse_host_list("  ", "-H").empty()); }

  TEST_CASE("list errors name the origin and column") {
    CHECK(list_error("a:2,b:0") ==
          "-H: column 7: bad slot count '0' in 'a:2,b:0' (expected a positive integer up to 65536)");
    std::string msg = list_error("a:2,b,a:3");
    CHECK(msg.rfind("-H: column 7: duplicate host 'a'", 0) == 0);
    CHECK(msg.find("first written at column 1") != std::string::npos);
    CHECK(list_error("a,b slots=4").rfind("-H: column 5: key=value in a comma list", 0) == 0);
    CHECK(list_error("a,").rfind("-H: column 3: empty item in list", 0) == 0);
    CHECK(list_error("gpu[01-02:8").rfind("-H: column 4: missing ']'", 0) == 0);
    CHECK(error_of([] {
            parse_host_list("x:y", "job.toml:7");
          }).rfind("job.toml:7: column 3: bad slot count 'y'", 0) == 0);
  }
}

TEST_SUITE("Slurm node lists") {
  TEST_CASE("ranges, lists and zero padding") {
    CHECK(expand_nodelist("gpu[01-04,07],cpu1") ==
          std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu1"});
    CHECK(expand_nodelist("n[8-11]") == std::vector<std::string>{"n8", "n9", "n10", "n11"});
    CHECK(expand_nodelist("n[098-101]") == std::vector<std::string>{"n098", "n099", "n100", "n101"});
    CHECK(expand_nodelist("n[5]") == std::vector<std::string>{"n5"});
    CHECK(expand_nodelist("n[007]") == std::vector<std::string>{"n007"});
  }

  TEST_CASE("suffix after the brackets and plain names") {
    CHECK(expand_nodelist("a[1-2]-ib,b") == std::vector<std::string>{"a1-ib", "a2-ib", "b"});
    CHECK(expand_nodelist("single") == std::vector<std::string>{"single"});
    CHECK(expand_nodelist("").empty());
  }

  TEST_CASE("several bracket groups multiply, first group slowest") {
    CHECK(expand_nodelist("r[1-2]n[1-2]") == std::vector<std::string>{"r1n1", "r1n2", "r2n1", "r2n2"});
    CHECK(expand_nodelist("r[1,3]n[01-02],x") ==
          std::vector<std::string>{"r1n01", "r1n02", "r3n01", "r3n02", "x"});
  }

  TEST_CASE("one bracket holds ranges and single numbers, each padded as written") {
    CHECK(expand_nodelist("n[01-03,07]") == std::vector<std::string>{"n01", "n02", "n03", "n07"});
    CHECK(expand_nodelist("n[7,01-02]") == std::vector<std::string>{"n7", "n01", "n02"});
  }

  TEST_CASE("commas inside brackets belong to the range, commas outside separate names") {
    CHECK(expand_nodelist("a[1,3],b[2-3,5]-ib, c") ==
          std::vector<std::string>{"a1", "a3", "b2-ib", "b3-ib", "b5-ib", "c"});
  }

  TEST_CASE("text after the brackets goes on every name") {
    CHECK(expand_nodelist("n[1-3]-ib") == std::vector<std::string>{"n1-ib", "n2-ib", "n3-ib"});
    CHECK(expand_nodelist("n[1-2].cluster.local") ==
          std::vector<std::string>{"n1.cluster.local", "n2.cluster.local"});
  }

  TEST_CASE("bad ranges: the whole message, with the column and a hint") {
    CHECK(error_of([] { expand_nodelist("n[3-1]"); }) ==
          "nodelist: column 3: range '3-1' runs backwards in 'n[3-1]' (write the smaller number first)");
    CHECK(error_of([] { expand_nodelist("n[01-03,7-]"); }) ==
          "nodelist: column 9: bad range '7-' in '[01-03,7-]' in 'n[01-03,7-]' "
          "(expected numbers and ranges such as '[01-04,07]')");
    CHECK(error_of([] { expand_nodelist("n[1-3]]"); }) ==
          "nodelist: column 7: unmatched ']' in 'n[1-3]]' (remove it, or open the bracket: 'gpu[01-04]')");
    CHECK(error_of([] { expand_nodelist("n[1-3],m[1,x]"); }) ==
          "nodelist: column 12: bad range 'x' in '[1,x]' in 'n[1-3],m[1,x]' "
          "(expected numbers and ranges such as '[01-04,07]')");
  }

  TEST_CASE("a whole node list stops at 65536 names") {
    CHECK(expand_nodelist("n[1-65536]").size() == 65536);
    CHECK(error_of([] {
            expand_nodelist("n[1-65536],x");
          }).rfind("nodelist: column 12: node list expands to more than 65536 names", 0) == 0);
  }

  TEST_CASE("malformed node lists") {
    struct Case {
      const char* list;
      const char* starts;
    };
    const std::vector<Case> cases = {
        {"a[1-2", "nodelist: column 2: missing ']'"},
        {"a]", "nodelist: column 2: unmatched ']'"},
        {"a[1-[2]]", "nodelist: column 5: nested '['"},
        {"a[]", "nodelist: column 2: empty range '[]'"},
        {"a[1-]", "nodelist: column 3: bad range '1-'"},
        {"a[-1]", "nodelist: column 3: bad range '-1'"},
        {"a[1,,2]", "nodelist: column 5: empty item in range"},
        {"a[3-1]", "nodelist: column 3: range '3-1' runs backwards"},
        {"a[1-08]", "nodelist: column 3: zero padding differs"},
        {"a[1-2-3]", "nodelist: column 3: bad range '1-2-3'"},
        {"a,,b", "nodelist: column 3: empty item in node list"},
        {"a,b c", "nodelist: column 4: bad character ' ' in host name 'b c'"},
        {"-a[1-2]", "nodelist: column 1: host name '-a1' starts with '-'"},
        {"n[1-70000]", "nodelist: column 2: '[1-70000]' expands to more than 65536 names"},
        {"a[1-300]b[1-300]", "nodelist: column 1: 'a[1-300]b[1-300]' expands to more than 65536 names"},
        {"a[99999999999999999999]", "nodelist: column 3: bad range"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.list);
      std::string msg = error_of([&] { expand_nodelist(c.list); });
      CHECK(msg.rfind(c.starts, 0) == 0);
      CHECK(msg.find("'" + std::string(c.list) + "'") != std::string::npos);
    }
  }
}

TEST_SUITE("filters") {
  std::vector<Host> four_hosts() {
    return parse_hostfile("worker-1 slots=4\nworker-2 slots=4\nworker-3 slots=2\ncpu\n", "h");
  }

  TEST_CASE("no filter keeps everything") {
    auto hosts = apply_filters(four_hosts(), "", "  ");
    CHECK(hosts.size() == 4);
    CHECK(hosts[0].slot_ids.empty());
  }

  TEST_CASE("include keeps only the named hosts and slots, in hostfile order") {
    auto hosts = apply_filters(four_hosts(), "worker-3@worker-1:2,0", "");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[0].name == "worker-1");
    CHECK(hosts[0].slot_ids == std::vector<int>{0, 2});
    CHECK(slot_count(hosts[0]) == 2);
    CHECK(hosts[0].slots == 4);
    CHECK(hosts[1].name == "worker-3");
    CHECK(hosts[1].slot_ids.empty());
    CHECK(slot_count(hosts[1]) == 2);
  }

  TEST_CASE("DeepSpeed example: host1:0,2@host2") {
    auto hosts = parse_hostfile("host1 slots=4\nhost2 slots=4\nhost3 slots=4\n", "h");
    hosts = apply_filters(hosts, "host1:0,2@host2", "");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[0].slot_ids == std::vector<int>{0, 2});
    CHECK(hosts[1].name == "host2");
    CHECK(slot_count(hosts[1]) == 4);
  }

  TEST_CASE("exclude removes slots, and hosts left without slots") {
    auto hosts = apply_filters(four_hosts(), "", "worker-1:1@worker-2@worker-3:0,1");
    REQUIRE(hosts.size() == 2);
    CHECK(hosts[0].name == "worker-1");
    CHECK(hosts[0].slot_ids == std::vector<int>{0, 2, 3});
    CHECK(hosts[1].name == "cpu");
    CHECK(slot_count(hosts[1]) == 1);
  }

  TEST_CASE("filters compose: a second filter sees the remaining slot ids") {
    auto hosts = apply_filters(four_hosts(), "worker-1:1,3", "");
    hosts = apply_filters(hosts, "", "worker-1:3");
    REQUIRE(hosts.size() == 1);
    CHECK(hosts[0].slot_ids == std::vector<int>{1});
    std::string msg = error_of([&] { apply_filters(hosts, "worker-1:0", ""); });
    CHECK(msg.find("host 'worker-1' has no slot 0") != std::string::npos);
    CHECK(msg.find("its slots are 1") != std::string::npos);
  }

  TEST_CASE("Slurm ranges and IPv6 addresses in filters") {
    auto hosts = parse_hostfile("gpu01:8\ngpu02:8\ngpu03:8\n[fe80::1]:2\n", "h");
    auto kept = apply_filters(hosts, "", "gpu[01,03]@[fe80::1]:1");
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].name == "gpu02");
    CHECK(kept[1].name == "fe80::1");
    CHECK(kept[1].slot_ids == std::vector<int>{0});
    kept = apply_filters(hosts, "gpu[02-03]:0,7", "");
    REQUIRE(kept.size() == 2);
    CHECK(kept[0].slot_ids == std::vector<int>{0, 7});
    CHECK(kept[1].slot_ids == std::vector<int>{0, 7});
  }

  TEST_CASE("host names in filters match case-insensitively") {
    auto kept = apply_filters(four_hosts(), "WORKER-2:3", "");
    REQUIRE(kept.size() == 1);
    CHECK(kept[0].slot_ids == std::vector<int>{3});
  }

  TEST_CASE("include and exclude together is an error") {
    std::string msg = error_of([&] { apply_filters(four_hosts(), "worker-1", "worker-2"); });
    CHECK(msg.find("--include 'worker-1' and --exclude 'worker-2'") == 0);
    CHECK(msg.find("only one of them may be given") != std::string::npos);
  }

  TEST_CASE("unknown host suggests the closest name") {
    std::string msg = error_of([&] { apply_filters(four_hosts(), "worker-1@wroker-2:0", ""); });
    CHECK(
        msg ==
        "--include: column 10: unknown host 'wroker-2' in 'worker-1@wroker-2:0' (did you mean 'worker-2'?)");
    msg = error_of([&] { apply_filters(four_hosts(), "", "zebra"); });
    CHECK(msg.rfind("--exclude: column 1: unknown host 'zebra'", 0) == 0);
    CHECK(msg.find("known hosts: worker-1, worker-2, worker-3, cpu") != std::string::npos);
    msg = error_of([&] { apply_filters({}, "a", ""); });
    CHECK(msg.find("there are no hosts to filter") != std::string::npos);
  }

  TEST_CASE("malformed filters") {
    struct Case {
      const char* include;
      const char* starts;
    };
    const std::vector<Case> cases = {
        {"worker-1:4", "--include: column 1: host 'worker-1' has no slot 4"},
        {"worker-3:0,2", "--include: column 1: host 'worker-3' has no slot 2"},
        {"worker-1:", "--include: column 10: missing slot list after ':'"},
        {"worker-1:0,,1", "--include: column 12: bad slot index ''"},
        {"worker-1:x", "--include: column 10: bad slot index 'x'"},
        {"worker-1:-1", "--include: column 10: bad slot index '-1'"},
        {"worker-1@@cpu", "--include: column 10: empty host in filter"},
        {"worker-1@", "--include: column 10: empty host in filter"},
        {":0", "--include: column 1: missing host name"},
        {"cpu@CPU", "--include: column 5: host 'CPU' named twice in the filter"},
        {"worker-[1-2", "--include: column 8: missing ']'"},
        {"[fe80::zz]:0", "--include: column 2: bad IPv6 address 'fe80::zz'"},
        {"cpu:0\x02", "--include: column 6: unexpected control character"},
        {"worker-1:0:1", "--include: column 10: bad slot index '0:1'"},
        {"[::1]x", "--include: column 6: unexpected 'x' after ']'"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.include);
      std::string msg = error_of([&] { apply_filters(four_hosts(), c.include, ""); });
      CHECK(msg.rfind(c.starts, 0) == 0);
      CHECK(msg.find('\n') == std::string::npos);
    }
  }

  TEST_CASE("a bracketed entry that is no IPv6 address gets the same hint as in a hostfile") {
    std::string msg = error_of([&] { apply_filters(four_hosts(), "[1-2]", ""); });
    CHECK(msg.rfind("--include: column 2: bad IPv6 address '1-2'", 0) == 0);
    CHECK(msg.find("a Slurm range needs a prefix, e.g. 'node[1-4]'") != std::string::npos);
  }
}

TEST_SUITE("robustness") {
  TEST_CASE("garbage never escapes as anything but ParseError") {
    // A deterministic stream of junk built from the grammar's own punctuation.
    const std::string alphabet = "ab1:[]@,=-. \t#\r\n/%x0sport";
    unsigned state = 12345;
    for (int round = 0; round < 2000; ++round) {
      std::string text;
      int len = static_cast<int>(state % 24);
      for (int i = 0; i < len; ++i) {
        state = state * 1103515245u + 12345u;
        text += alphabet[(state >> 16) % alphabet.size()];
      }
      state = state * 1103515245u + 12345u;
      CAPTURE(text);
      try {
        auto hosts = parse_hostfile(text, "fuzz");
        for (const auto& h : hosts) CHECK(!h.name.empty());
      } catch (const ParseError& e) {
        std::string msg = e.what();
        CHECK(msg.rfind("fuzz:", 0) == 0);
        CHECK(msg.find('\n') == std::string::npos);
      }
      try {
        parse_host_list(text, "-H");
      } catch (const ParseError& e) {
        CHECK(std::string(e.what()).rfind("-H: column ", 0) == 0);
      }
      try {
        expand_nodelist(text);
      } catch (const ParseError& e) {
        CHECK(std::string(e.what()).rfind("nodelist: column ", 0) == 0);
      }
    }
  }
}
