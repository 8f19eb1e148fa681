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

TEST_CASE("text: rank lists") {
  CHECK(parse_int_list("0,3-5") == std::vector<int>{0, 3, 4, 5});
  CHECK(parse_int_list(" 7 ") == std::vector<int>{7});
  for (const char* bad : {"", "a", "1,", "5-3", "-1", "1-x"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_int_list(bad).has_value());
  }
}

TEST_CASE("text: shell quoting for display") {
  CHECK(shell_quote("plain-word_1.txt") == "plain-word_1.txt");
  CHECK(shell_quote("a b") == "'a b'");
  CHECK(shell_quote("it's") == "'it'\\''s'");
  CHECK(shell_quote("") == "''");
}
