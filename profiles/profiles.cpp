#include "profiles/profiles.h"

#include <dirent.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

namespace mltrain::profiles {
namespace detail {
extern const std::pair<std::string_view, std::string_view> kEmbedded[];  // {"local.toml", text}
extern const int kEmbeddedCount;
}  // namespace detail

namespace {
std::string user_dir() {
  if (const char* x = std::getenv("XDG_CONFIG_HOME"); x && *x) return std::string(x) + "/mltrain/profiles";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.config/mltrain/profiles";
  return {};
}

std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}
}  // namespace

std::optional<Profile> find(const std::string& name, const std::string& base_dir) {
  if (name.find('/') != std::string::npos || ends_with(name, ".toml")) {
    std::string path = (name[0] == '/' || base_dir.empty()) ? name : base_dir + "/" + name;
    auto text = read_file(path);
    if (!text) return std::nullopt;
    return Profile{name, path, *text};
  }
  if (auto dir = user_dir(); !dir.empty()) {
    std::string path = dir + "/" + name + ".toml";
    if (auto text = read_file(path)) return Profile{name, path, *text};
  }
  for (int i = 0; i < detail::kEmbeddedCount; ++i)
    if (detail::kEmbedded[i].first == name + ".toml")
      return Profile{name, "built-in:" + name, std::string(detail::kEmbedded[i].second)};
  return std::nullopt;
}

std::vector<std::string> available() {
  std::vector<std::string> names;
  for (int i = 0; i < detail::kEmbeddedCount; ++i) {
    std::string_view f = detail::kEmbedded[i].first;
    names.emplace_back(f.substr(0, f.size() - 5));
  }
  if (auto dir = user_dir(); !dir.empty()) {
    if (DIR* d = ::opendir(dir.c_str())) {
      while (dirent* e = ::readdir(d)) {
        std::string f = e->d_name;
        if (ends_with(f, ".toml")) names.push_back(f.substr(0, f.size() - 5));
      }
      ::closedir(d);
    }
  }
  return names;
}

}  // namespace mltrain::profiles
