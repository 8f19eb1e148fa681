#include "hostfile/detail/where.h"

#include <cstdio>

#include "hostfile/hostfile.h"
#include "runner/common/text.h"

namespace mltrain::hostfile::detail {
namespace {

// Messages stay one readable line even when the offending line is enormous.
constexpr std::size_t max_quoted_chars = 120;

}  // namespace

std::string escaped(std::string_view s) { return text::excerpt(s, max_quoted_chars); }

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
