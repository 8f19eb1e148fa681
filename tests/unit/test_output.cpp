// Output merging: whole prefixed lines on the console, exact bytes in rank files.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "runner/records/records.h"
#include "runner/supervise/output.h"

namespace fs = std::filesystem;
using namespace mltrain::supervise;

namespace {

struct Fixture {
  fs::path dir;
  int out[2], err[2];
  Fixture() {
    char tmpl[] = "/tmp/mltrain-output-XXXXXX";
    dir = ::mkdtemp(tmpl);
    REQUIRE(::pipe(out) == 0);
    REQUIRE(::pipe(err) == 0);
    ::fcntl(out[0], F_SETFL, O_NONBLOCK);
    ::fcntl(err[0], F_SETFL, O_NONBLOCK);
  }
  ~Fixture() {
    for (int fd : {out[0], out[1], err[0], err[1]}) ::close(fd);
    fs::remove_all(dir);
  }
  static std::string drain(int fd) {
    std::string s;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) s.append(buf, size_t(n));
    return s;
  }
  std::string file(int rank) const {
    std::ifstream in(dir / ("rank-" + std::to_string(rank) + ".log"));
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::vector<RankInfo> ranks(int n) {
    std::vector<RankInfo> v;
    for (int i = 0; i < n; ++i) v.push_back({i, i, 0, "h"});
    return v;
  }
};

}  // namespace

TEST_CASE("output: interleaved partial writes come out as whole prefixed lines") {
  Fixture fx;
  {
    Output o(fx.ranks(2), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    o.data(0, 1, "hel");
    o.data(1, 1, "wor");
    o.data(0, 1, "lo\nsecond ");
    o.data(1, 1, "ld\n");
    o.data(0, 2, "oops\n");
    o.data(0, 1, "line\n");
    o.flush();
    CHECK(Fixture::drain(fx.out[0]) == "[0] hello\n[1] world\n[0] second line\n");
    CHECK(Fixture::drain(fx.err[0]) == "[0] oops\n");
  }
  CHECK(fx.file(0) == "hello\noops\nsecond line\n");
  CHECK(fx.file(1) == "world\n");
}

TEST_CASE("output: stdout and stderr lines reach the console in the order they came") {
  Fixture fx;
  {
    Output o(fx.ranks(1), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    CHECK_FALSE(o.one_stream());  // two pipes: the console's stdout and stderr are apart
    o.data(0, 1, "a\n");
    o.data(0, 2, "b\n");
    o.data(0, 1, "c\n");
    o.flush();
  }
  CHECK(fx.file(0) == "a\nb\nc\n");
  // One pipe for both, read as it was written: the order across the two is the order of the calls.
  int both[2];
  REQUIRE(::pipe(both) == 0);
  {
    Output o(fx.ranks(1), false, fx.dir.string(), ConsoleOptions{}, both[1], both[1]);
    CHECK(o.one_stream());
    o.data(0, 2, "err 1\n");
    o.data(0, 1, "out 1\n");
    o.data(0, 2, "err 2\n");
    o.flush();
  }
  ::close(both[1]);
  CHECK(Fixture::drain(both[0]) == "[0] err 1\n[0] out 1\n[0] err 2\n");
  ::close(both[0]);
  ConsoleOptions quiet;
  quiet.quiet = true;
  CHECK(Output(fx.ranks(1), false, fx.dir.string(), quiet, fx.out[1], fx.err[1]).one_stream());
}

TEST_CASE("output: an unterminated last line is kept; the console ends it") {
  Fixture fx;
  {
    Output o(fx.ranks(1), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    o.data(0, 1, "done\nno newline");
    o.finish(0);
    o.flush();
    CHECK(Fixture::drain(fx.out[0]) == "[0] done\n[0] no newline\n");
    CHECK(o.tail(0) == std::vector<std::string>{"done", "no newline"});
  }
  CHECK(fx.file(0) == "done\nno newline");
}

TEST_CASE("output: an overlong line is passed on in pieces, bytes intact") {
  Fixture fx;
  std::string big(Output::kMaxLine * 2 + 10, 'z');
  {
    ConsoleOptions c;
    c.quiet = true;
    Output o(fx.ranks(1), false, fx.dir.string(), c, fx.out[1], fx.err[1]);
    for (size_t off = 0; off < big.size(); off += 70000)
      o.data(0, 1, std::string_view(big).substr(off, 70000));
    o.data(0, 1, "\n");
  }
  CHECK(fx.file(0) == big + "\n");
  CHECK(Fixture::drain(fx.out[0]).empty());
}

TEST_CASE("output: console filter, prefix templates, colour") {
  Fixture fx;
  ConsoleOptions c;
  c.ranks = std::set<int>{1};
  c.prefix = "<{host}/{rank}/{local_rank}>";
  c.color = true;
  {
    Output o(fx.ranks(2), true, fx.dir.string(), c, fx.out[1], fx.err[1]);
    o.data(0, 1, "hidden\n");
    o.data(1, 1, "shown\n");
    o.flush();
    std::string console = Fixture::drain(fx.out[0]);
    CHECK(console.find("hidden") == std::string::npos);
    CHECK(console.find("<h/1/1>\033[0m shown\n") != std::string::npos);
    CHECK(console.find("\033[") == 0);
  }
  CHECK(fx.file(0) == "hidden\n");  // files get every rank
}

TEST_CASE("output: after an elastic regroup a rank's prefix names its new host; its file stays") {
  Fixture fx;
  {
    Output o({{0, 0, 0, "h1"}, {1, 0, 1, "h2"}, {2, 0, 2, "h3"}}, true, fx.dir.string(), ConsoleOptions{},
             fx.out[1], fx.err[1]);
    o.data(1, 1, "before\n");
    o.flush();
    CHECK(Fixture::drain(fx.out[0]) == "[h2:1] before\n");
    o.relabel({{0, 0, 0, "h1"}, {1, 0, 1, "h4"}});  // h2 lost, h4 in its place; rank 2 gone
    o.data(1, 1, "after\n");
    o.flush();
    CHECK(Fixture::drain(fx.out[0]) == "[h4:1] after\n");
  }
  CHECK(fx.file(1) == "before\nafter\n");
}

TEST_CASE("output: render_prefix") {
  RankInfo r{5, 1, 2, "gpu3"};
  CHECK(render_prefix("auto", r, false) == "[5]");
  CHECK(render_prefix("auto", r, true) == "[gpu3:5]");
  CHECK(render_prefix("", r, true).empty());
  CHECK(render_prefix("{node}.{local_rank}", r, false) == "2.1");
}

TEST_CASE("output: a partial line shows after the delay and its rest continues it") {
  Fixture fx;
  Output o(fx.ranks(2), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
  o.data(0, 1, "(Pdb) ");
  o.flush();
  CHECK(Fixture::drain(fx.out[0]).empty());
  CHECK(o.due_in() <= Output::kPartialDelay);
  ::usleep(useconds_t(std::chrono::microseconds(Output::kPartialDelay).count() + 20000));
  o.flush();
  CHECK(Fixture::drain(fx.out[0]) == "[0] (Pdb) ");
  o.data(0, 1, "next\n");
  o.flush();
  CHECK(Fixture::drain(fx.out[0]) == "next\n");
  // Another rank's line in between ends the fragment; the rest gets its own prefix.
  o.data(0, 1, "ask ");
  ::usleep(useconds_t(std::chrono::microseconds(Output::kPartialDelay).count() + 20000));
  o.flush();
  o.data(1, 1, "other\n");
  o.data(0, 1, "answer\n");
  o.flush();
  CHECK(Fixture::drain(fx.out[0]) == "[0] ask \n[1] other\n[0] answer\n");
}

TEST_CASE("output: off a terminal, \\r progress prints states as lines, the file keeps the bytes") {
  Fixture fx;
  {
    Output o(fx.ranks(1), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    o.data(0, 2, "\r 10%|#");
    o.flush();  // the first state at once
    o.data(0, 2, "\r 50%|###");
    o.flush();  // throttled
    o.data(0, 2, "\r100%|#####\n");
    o.flush();
    CHECK(Fixture::drain(fx.err[0]) == "[0]  10%|#\n[0] 100%|#####\n");
    CHECK(o.tail(0) == std::vector<std::string>{"100%|#####"});
  }
  CHECK(fx.file(0) == "\r 10%|#\r 50%|###\r100%|#####\n");
}

TEST_CASE("output: escape_console and complete_utf8") {
  CHECK(escape_console("a\x01\tb") == "a\\x01\tb");
  CHECK(escape_console("\x1b[1;31mred\x1b[0m") == "\x1b[1;31mred\x1b[0m");
  CHECK(escape_console("\x1b]0;t\x07") == "\\x1b]0;t\\x07");
  CHECK(escape_console("\xe2\x9c\x93 \xff \xe2\x9c") == "\xe2\x9c\x93 \\xff \\xe2\\x9c");
  // Not a terminal: invalid UTF-8 passes, but never a C1 control, raw (0x9b) or encoded (U+009B).
  CHECK(escape_console("caf\xe9 \xff\xfe \x9b \xc2\x9b \x1b]0;t\x07 \xe2\x9c", false) ==
        "caf\xe9 \xff\xfe \\x9b \\u{009b} \\x1b]0;t\\x07 \xe2\\x9c");
  CHECK(escape_console("\x1b[31mred\x1b[0m\t\xe2\x9c\x93", false) == "\x1b[31mred\x1b[0m\t\xe2\x9c\x93");
  CHECK(complete_utf8("ab\xe2\x9c") == 2);
  CHECK(complete_utf8("ab\xe2\x9c\x93") == 5);
  CHECK(complete_utf8("ab") == 2);
}

TEST_CASE("output: output.order lists arrivals of whole lines in order, a rank's consecutive ones as one") {
  Fixture fx;
  {
    Output o(fx.ranks(2), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    o.data(0, 1, "a\n");
    o.data(0, 2, "b\n");  // rank 0 again: the same entry grows
    o.data(1, 1, "par");  // no newline yet: nothing for the file, no entry
    o.data(1, 1, "tial\n");
    o.data(0, 1, "c\n");
    o.flush();
    o.data(1, 1, "end");  // never ended: the file gets it when the rank finishes
  }
  std::ifstream in(fx.dir / "output.order", std::ios::binary);
  std::vector<mltrain::records::OrderEntry> got;
  mltrain::records::OrderEntry e{};
  while (in.read(reinterpret_cast<char*>(&e), sizeof e)) got.push_back(e);
  REQUIRE(got.size() == 4);
  CHECK((got[0].rank == 0 && got[0].end == 4));   // "a\nb\n"
  CHECK((got[1].rank == 1 && got[1].end == 8));   // "partial\n"
  CHECK((got[2].rank == 0 && got[2].end == 6));   // + "c\n"
  CHECK((got[3].rank == 1 && got[3].end == 11));  // + "end"
  CHECK(fx.file(0) == "a\nb\nc\n");
  CHECK(fx.file(1) == "partial\nend");
}

TEST_CASE("output: a reopened run continues output.order at each file's size") {
  Fixture fx;
  for (int round = 0; round < 2; ++round) {
    Output o(fx.ranks(1), false, fx.dir.string(), ConsoleOptions{}, fx.out[1], fx.err[1]);
    o.data(0, 1, "xy\n");
  }
  std::ifstream in(fx.dir / "output.order", std::ios::binary);
  mltrain::records::OrderEntry e[3]{};
  in.read(reinterpret_cast<char*>(e), sizeof e);
  CHECK(in.gcount() == 2 * sizeof(mltrain::records::OrderEntry));
  CHECK(e[0].end == 3);
  CHECK(e[1].end == 6);
}
