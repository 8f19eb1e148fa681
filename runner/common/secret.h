// Which environment variables hold secrets, and how mltrain shows them. Ranks always get the real
// values; run records, dry runs, `show` and every message show "<secret>" instead (docs/spec.md).
#pragma once

#include <string>
#include <string_view>

namespace mltrain::secret {

inline constexpr std::string_view kShown = "<secret>";

// Whether a variable's name says it holds a secret: MLTRAIN_TOKEN, *_KEY, *TOKEN*, *SECRET*,
// *PASSWORD* (any case), or a match of a glob listed in MLTRAIN_SECRET_VARS (comma-separated).
bool is_secret_name(std::string_view name);

// `value`, or "<secret>" when `name` is secret.
std::string shown_value(std::string_view name, std::string_view value);

}  // namespace mltrain::secret
