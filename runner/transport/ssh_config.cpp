#include "runner/transport/ssh_config.h"

#include <fnmatch.h>
#include <glob.h>

#include <cctype>
#include <fstream>
#include <sstream>

namespace mltrain::transport {
namespace {

constexpr int kMaxIncludeDepth = 16;

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Splits a value into words; double quotes group words and are removed.
std::vector<std::string> split_args(std::string_view v) {
  std::vector<std::string> out;
  std::string cur;
  bool quoted = false, any = false;
  for (char c : v) {
    if (c == '"') {
      quoted = !quoted;
      any = true;
    } else if (!quoted && (c == ' ' || c == '\t')) {
      if (any) out.push_back(cur);
      cur.clear();
      any = false;
    } else {
      cur += c;
      any = true;
    }
  }
  if (any) out.push_back(cur);
  return out;
}

std::string unquote(std::string v) {
  if (v.size() >= 2 && v.front() == '"' && v.back() == '"' && v.find('"', 1) == v.size() - 1)
    return v.substr(1, v.size() - 2);
  return v;
}

std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ',' || c == ' ' || c == '\t') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

std::string read_file(const std::string& path, bool& ok) {
  std::ifstream in(path);
  ok = bool(in);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// A Match line's criteria hold for `host`. Unknown criteria never hold.
bool match_applies(const std::vector<std::string>& args, const std::string& host) {
  if (args.empty()) return false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string crit = lower(args[i]);
    bool negate = !crit.empty() && crit[0] == '!';
    if (negate) crit.erase(0, 1);
    bool holds;
    if (crit == "all") {
      holds = true;
    } else if ((crit == "host" || crit == "originalhost") && i + 1 < args.size()) {
      holds = ssh_host_matches(host, split_list(args[++i]));
    } else {
      return false;
    }
    if (holds == negate) return false;
  }
  return true;
}

}  // namespace

bool ssh_host_matches(const std::string& host, const std::vector<std::string>& patterns) {
  std::string h = lower(host);
  bool matched = false;
  for (const auto& raw : patterns) {
    bool negate = !raw.empty() && raw[0] == '!';
    std::string pat = lower(negate ? raw.substr(1) : raw);
    if (::fnmatch(pat.c_str(), h.c_str(), 0) != 0) continue;
    if (negate) return false;
    matched = true;
  }
  return matched;
}

std::string expand_home(const std::string& path, const std::string& home) {
  if (path == "~" || path.rfind("~/", 0) == 0) return home + path.substr(1);
  return path;
}

std::string proxy_command_for_jump(const std::string& config, const std::string& jump) {
  auto last = jump.rfind(',');
  return "ssh -F '" + config + "' -W '[%h]:%p'" +
         (last == std::string::npos ? " " + jump
                                    : " -J " + jump.substr(0, last) + " " + jump.substr(last + 1));
}

SshConfig SshConfig::load(const std::string& path, const std::string& home) {
  SshConfig c;
  bool ok = false;
  std::string text = read_file(path, ok);
  if (ok) c.lines_ = parse_lines(text, home, 0);
  return c;
}

SshConfig SshConfig::parse(std::string_view text, const std::string& home) {
  SshConfig c;
  c.lines_ = parse_lines(text, home, 0);
  return c;
}

std::vector<SshConfig::Line> SshConfig::parse_lines(std::string_view text, const std::string& home,
                                                    int depth) {
  std::vector<Line> lines;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    std::string l(text.substr(pos, eol == std::string_view::npos ? std::string_view::npos : eol - pos));
    pos = eol == std::string_view::npos ? text.size() : eol + 1;
    size_t b = l.find_first_not_of(" \t");
    if (b == std::string::npos || l[b] == '#') continue;
    size_t kend = l.find_first_of(" \t=", b);
    Line line;
    line.keyword = lower(l.substr(b, kend == std::string::npos ? std::string::npos : kend - b));
    if (kend != std::string::npos) {
      // One '=' may stand between keyword and value, with blanks around it.
      size_t vb = l.find_first_not_of(" \t", kend);
      if (vb != std::string::npos && l[vb] == '=') vb = l.find_first_not_of(" \t", vb + 1);
      size_t ve = l.find_last_not_of(" \t\r");
      if (vb != std::string::npos && ve >= vb) line.value = l.substr(vb, ve - vb + 1);
    }
    line.args = split_args(line.value);
    line.value = unquote(line.value);
    if (line.keyword == "include" && depth < kMaxIncludeDepth) {
      for (const auto& pattern : line.args) {
        std::string p = expand_home(pattern, home);
        if (p.empty() || p[0] != '/') p = home + "/.ssh/" + p;
        glob_t g{};
        if (::glob(p.c_str(), 0, nullptr, &g) == 0) {
          for (size_t i = 0; i < g.gl_pathc; ++i) {
            bool ok = false;
            std::string inc = read_file(g.gl_pathv[i], ok);
            if (!ok) continue;
            line.included.push_back(parse_lines(inc, home, depth + 1));
          }
        }
        ::globfree(&g);
      }
    }
    lines.push_back(std::move(line));
  }
  return lines;
}

// As ssh reads it: each included file starts active and the block state returns after it; an
// Include in a block that does not apply is skipped whole.
bool SshConfig::lookup(const std::vector<Line>& lines, const std::string& host, const std::string& keyword,
                       std::string& out, std::vector<std::string>* all) {
  bool active = true;
  for (const auto& line : lines) {
    if (line.keyword == "host") {
      active = ssh_host_matches(host, line.args);
    } else if (line.keyword == "match") {
      active = match_applies(line.args, host);
    } else if (!active) {
      continue;
    } else if (line.keyword == "include") {
      for (const auto& file : line.included)
        if (lookup(file, host, keyword, out, all)) return true;
    } else if (line.keyword == keyword) {
      if (all) {
        all->push_back(line.value);
        continue;
      }
      out = line.value;
      return true;
    }
  }
  return false;
}

std::string SshConfig::value(const std::string& host, std::string_view keyword) const {
  std::string out;
  lookup(lines_, host, lower(std::string(keyword)), out);
  return out;
}

std::vector<std::string> SshConfig::values(const std::string& host, std::string_view keyword) const {
  std::string unused;
  std::vector<std::string> all;
  lookup(lines_, host, lower(std::string(keyword)), unused, &all);
  return all;
}

}  // namespace mltrain::transport
