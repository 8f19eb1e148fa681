#include <doctest/doctest.h>

#include "runner/common/text.h"

using namespace mltrain::text;
using std::chrono::milliseconds;

TEST_CASE("text: durations") {
  CHECK(parse_duration("90s") == milliseconds(90000));
  CHECK(parse_duration("2h") == milliseconds(7200000));
  CHECK(parse_duration("1h30m") == milliseconds(5400000));
  CHECK(parse_duration("500ms") == milliseconds(500));
  CHECK(parse_duration("1.5m") == milliseconds(90000));
  CHECK(parse_duration("12") == milliseconds(12000));
  CHECK(parse_duration(" 3s ") == milliseconds(3000));
  for (const char* bad : {"", "s", "5x", "1h 30", "abc", "1..2s", "-3s", "10 minutes", "3s5"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_duration(bad).has_value());
  }
  CHECK(format_duration(milliseconds(59)) == "59ms");
  CHECK(format_duration(milliseconds(1500)) == "1.5s");
  CHECK(format_duration(milliseconds(125000)) == "2m05s");
  CHECK(format_duration(milliseconds(7260000)) == "2h01m");
}

TEST_CASE("text: did you mean") {
  CHECK(did_you_mean("comand", {"command", "argv"}) == " (did you mean 'command'?)");
  CHECK(did_you_mean("zzzzzz", {"command", "argv"}).empty());
  CHECK(closest("prot", {"port", "user"}) == "port");
}

// The one engine behind every "did you mean" (spec keys, flags, profiles, hostfile keys and hosts).
TEST_CASE("text: did you mean, the rules") {
  // Case does not count as an edit: host names are case-insensitive, and "Name" is a typo of "name".
  CHECK(closest("Worker-2", {"worker-1", "worker-2"}) == "worker-2");
  CHECK(closest("NMAE", {"name"}) == "name");
  // At most a third of the word in edits, capped at 3 however long the word is.
  CHECK(closest("maxslots", {"max_slots"}) == "max_slots");
  CHECK_FALSE(closest("gpu-node-zzzz", {"gpu-node-0001"}).has_value());
  // A word that shares no letter with the candidate is no typo of it.
  CHECK_FALSE(closest("a", {"b"}).has_value());
  // A shortened name counts when it begins exactly one candidate.
  CHECK(closest("grace", {"grace_period", "timeout"}) == "grace_period");
  CHECK_FALSE(closest("worker", {"worker-10", "worker-20"}).has_value());
  CHECK_FALSE(closest("gr", {"grace_period"}).has_value());
  // Huge words get no suggestion (and cost no quadratic time).
  CHECK_FALSE(closest(std::string(100000, 'a'), {std::string(100000, 'a') + "b"}).has_value());
}

TEST_CASE("text: rank lists") {
  CHECK(parse_int_list("0,3-5") == std::vector<int>{0, 3, 4, 5});
  CHECK(parse_int_list(" 7 ") == std::vector<int>{7});
  for (const char* bad : {"", "a", "1,", "5-3", "-1", "1-x"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_int_list(bad).has_value());
  }
}

TEST_CASE("text: rank ranges, compact host names, cut to a width") {
  CHECK(int_ranges({6, 0, 1, 2, 3}) == "0-3,6");
  CHECK(int_ranges({2, 5}) == "2,5");
  CHECK(int_ranges({4, 5, 5}) == "4,5");
  CHECK(int_ranges({}).empty());
  CHECK(int_ranges({0, 2, 4, 6, 8, 10, 12}, 10) == "0,2,4,6,\u2026");
  CHECK(int_ranges({0, 2, 4}, 10) == "0,2,4");
  CHECK(parse_int_list(int_ranges({9, 1, 2, 3, 7})) == std::vector<int>{1, 2, 3, 7, 9});
  CHECK(compact_names({"h1", "h3"}) == "h1, h3");
  CHECK(compact_names({"h1", "h2", "h3", "h5", "login", "h2"}) == "h[1-3,5], login");
  CHECK(compact_names({"gpu01", "gpu02", "gpu03", "gpu10"}) == "gpu[01-03,10]");
  CHECK(compact_names({"localhost", "127.0.0.2", "127.0.0.3"}) == "localhost, 127.0.0.2, 127.0.0.3");
  CHECK(compact_names({"10.0.0.1", "10.0.0.2", "10.0.0.3"}) == "10.0.0.[1-3]");
  CHECK(cut("abcde", 5) == "abcde");
  CHECK(cut("abcdefg", 5) == "abcd\u2026");
  CHECK(cut("h\u00e9llo world", 4) == "h\u00e9l\u2026");
  CHECK(cut("ab", 0).empty());
}

TEST_CASE("text: shell quoting for display") {
  CHECK(shell_quote("plain-word_1.txt") == "plain-word_1.txt");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
}

TEST_CASE("text: excerpt keeps a message one short line") {
  CHECK(excerpt("abc") == "abc");
  CHECK(excerpt("a\tb\nc\x7f") == "a\\tb\\x0ac\\x7f");
  CHECK(excerpt(std::string(1000, 'k'), 5) == "kkkkk...");
  CHECK(excerpt("\xc3\xa9") == "\\xc3\\xa9");
}

// The one sanitiser of host text (issue 31, item 12): nothing a terminal acts on passes, a NUL
// does not end the text, the result is valid UTF-8 and sanitising it again changes nothing.
TEST_CASE("text: host_text escapes what a terminal would act on") {
  CHECK(host_text("NVIDIA H100 80GB HBM3") == "NVIDIA H100 80GB HBM3");
  CHECK(host_text("caf\xc3\xa9 \xe2\x9c\x93") == "caf\xc3\xa9 \xe2\x9c\x93");  // printable UTF-8 passes
  // A title-setting OSC and a screen clear, as an audit's GPU name carried them.
  CHECK(host_text("GPU\x1b]0;pwned\x07\x1b[2J") == "GPU\\x1b]0;pwned\\x07\\x1b[2J");
  CHECK(host_text("\x1b[31mred") == "\\x1b[31mred");  // host text gets no colour either
  CHECK(host_text(std::string("a\0b", 3)) == "a\\x00b");
  CHECK(host_text("one\ntwo\r\tx\x7f") == "one\\x0atwo\\x0d\\tx\\x7f");
  CHECK(host_text("\xff\xc3") == "\\xff\\xc3");                               // invalid, cut
  CHECK(host_text("\xc0\xaf \xed\xa0\x80") == "\\xc0\\xaf \\xed\\xa0\\x80");  // overlong, surrogate
  CHECK(host_text("\xc2\x9b"
                  "2J") == "\\u{009b}2J");  // C1 CSI
  CHECK(host_text("abc\xe2\x80\xae"
                  "fdp.exe") == "abc\\u{202e}fdp.exe");  // a bidi override
  CHECK(host_text("abcdef", 3) == "abc...");
  for (std::string s :
       {std::string("\x1b]0;t\x07"), std::string("x\0y\xff\xe2\x80\xae", 6), std::string("\t\n")}) {
    std::string once = host_text(s);
    CHECK(host_text(once) == once);
    for (char c : once) CHECK((static_cast<unsigned char>(c) >= 0x20 && c != 0x7f));
  }
}

TEST_CASE("text: escape_console is host_text that keeps tab and colour") {
  CHECK(escape_console("a\tb\x1b[1;31mred\x1b[0m\x1b]0;t\x07") == "a\tb\x1b[1;31mred\x1b[0m\\x1b]0;t\\x07");
  CHECK(escape_console("\xc2\x9b"
                       "2J") == "\\u{009b}2J");
}
