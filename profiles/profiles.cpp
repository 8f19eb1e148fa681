#include "profiles/profiles.h"

#include <dirent.h>

#include <fstream>
#include <sstream>
#include <string_view>
#include <utility>

#include "knobs/knobs.h"

namespace mltrain::profiles {
namespace detail {
extern const std::pair<std::string_view, std::string_view> kEmbedded[];  // {"local.toml", text}
extern const int kEmbeddedCount;
}  // namespace detail

namespace {
std::string user_dir() {
  if (const std::string x = knobs::xdg_config_home.get(); !x.empty()) return x + "/mltrain/profiles";
  if (const std::string h = knobs::home.get(); !h.empty()) return h + "/.config/mltrain/profiles";
  return {};
}

// At most kMaxProfileBytes + 1 bytes: enough to tell a profile that is too large.
std::optional<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text;
  char buf[65536];
  while (text.size() <= kMaxProfileBytes && in.read(buf, sizeof buf).gcount() > 0)
    text.append(buf, size_t(in.gcount()));
  return text;
}

Profile make(const std::string& name, const std::string& path, std::string text) {
  Profile p{name, path, std::move(text)};
  if (p.text.size() > kMaxProfileBytes) {
    p.text.resize(kMaxProfileBytes);
    p.too_large = true;
  }
  return p;
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
    return make(name, path, std::move(*text));
  }
  if (auto dir = user_dir(); !dir.empty()) {
    std::string path = dir + "/" + name + ".toml";
    if (auto text = read_file(path)) return make(name, path, std::move(*text));
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
