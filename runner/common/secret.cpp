#include "runner/common/secret.h"

#include <fnmatch.h>

#include <cctype>

#include "knobs/knobs.h"
#include "runner/common/text.h"

namespace mltrain::secret {

namespace {

std::string upper(std::string_view s) {
  std::string out(s);
  for (auto& c : out) c = char(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

bool is_secret_name(std::string_view name) {
  const std::string n = upper(name);
  if (n == "MLTRAIN_TOKEN") return true;
  if (n.size() >= 4 && n.compare(n.size() - 4, 4, "_KEY") == 0) return true;
  for (const char* word : {"TOKEN", "SECRET", "PASSWORD"})
    if (n.find(word) != std::string::npos) return true;
  for (const auto& glob : text::split(knobs::mltrain_secret_vars.get(), ',')) {
    const std::string g = upper(text::trim(glob));
    if (!g.empty() && ::fnmatch(g.c_str(), n.c_str(), 0) == 0) return true;
  }
  return false;
}

std::string shown_value(std::string_view name, std::string_view value) {
  return is_secret_name(name) ? std::string(kShown) : std::string(value);
}

}  // namespace mltrain::secret
