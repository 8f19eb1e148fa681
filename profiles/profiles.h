// Built-in profiles and the search for user profiles. A profile is a partial job spec (TOML)
// that a spec merges itself over; see docs/spec.md, "Profiles".
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace mltrain::profiles {

// A profile is a small TOML file; past this it is not read further (a path like /dev/zero).
inline constexpr size_t kMaxProfileBytes = size_t{16} << 20;

struct Profile {
  std::string name;
  std::string origin;      // a file path, or "built-in:NAME"
  std::string text;        // TOML
  bool too_large = false;  // the file is larger than kMaxProfileBytes: `text` is cut there
};

// Finds NAME: a path (contains '/' or ends in .toml, relative to `base_dir`), else
// $XDG_CONFIG_HOME/mltrain/profiles/NAME.toml (~/.config when unset), else a built-in.
std::optional<Profile> find(const std::string& name, const std::string& base_dir);

// Names of the built-in profiles and the user's, for messages and completion.
std::vector<std::string> available();

}  // namespace mltrain::profiles
