// Where a piece of hostfile text sits, and the one-line ParseError that points at it.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace mltrain::hostfile::detail {

// `s` with control and non-ASCII bytes escaped and cut to a readable length, so a message is always
// one printable line.
std::string escaped(std::string_view s);
std::string quoted(std::string_view s);  // escaped(s) in single quotes

// The text being parsed and how to name a position in it. Every string_view handed to fail()
// must point into `text`, so its offset gives the column.
struct Where {
  std::string label;  // "hosts.txt:3" for a hostfile line, "-H" or "--include" for a list
  bool is_file_line = false;
  std::string_view text;  // the whole line or list, quoted in every message

  std::size_t column_of(std::string_view piece) const;

  // Names an item for "first written at ..." in duplicate messages.
  std::string position_of(std::string_view piece) const;

  // Throws ParseError: "<label>:<col>: <what> in '<text>' (<hint>)" for a file line,
  // "<label>: column <col>: ..." for a list.
  [[noreturn]] void fail(std::string_view piece, const std::string& what, const std::string& hint) const;
};

}  // namespace mltrain::hostfile::detail
