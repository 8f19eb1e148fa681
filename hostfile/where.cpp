#include "hostfile/detail/where.h"

#include <cstdio>

#include "hostfile/hostfile.h"

namespace mltrain::hostfile::detail {
namespace {

// Messages stay one readable line even when the offending line is enormous.
constexpr std::size_t max_quoted_chars = 120;

}  // namespace

std::string escaped(std::string_view s) {
  std::string out;
  for (char ch : s.substr(0, max_quoted_chars)) {
    auto c = static_cast<unsigned char>(ch);
    if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    } else {
      out += ch;
    }
  }
  if (s.size() > max_quoted_chars) out += "...";
  return out;
}

std::string quoted(std::string_view s) { return "'" + escaped(s) + "'"; }

std::size_t Where::column_of(std::string_view piece) const {
  return static_cast<std::size_t>(piece.data() - text.data()) + 1;
}

std::string Where::position_of(std::string_view piece) const {
  return is_file_line ? label : "column " + std::to_string(column_of(piece));
}

void Where::fail(std::string_view piece, const std::string& what, const std::string& hint) const {
  std::string col = std::to_string(column_of(piece));
  std::string msg = is_file_line ? label + ":" + col + ": " : label + ": column " + col + ": ";
  msg += what + " in " + quoted(text);
  if (!hint.empty()) msg += " (" + hint + ")";
  throw ParseError(msg);
}

}  // namespace mltrain::hostfile::detail
