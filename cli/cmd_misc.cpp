// `mltrain completions` and `mltrain knobs`.
#include <sys/ioctl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/records/records.h"

namespace mltrain::cli {

namespace completions {
extern const std::pair<std::string_view, std::string_view> kEmbedded[];
extern const int kEmbeddedCount;
}  // namespace completions

namespace {

// `mltrain knobs --json`: one object per knob.
std::string json_string(std::string_view v) {
  std::string out = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
      out += buf;
      continue;
    }
    out += c;
  }
  return out + "\"";
}

std::string_view shown_default(const knobs::Knob& k) {
  return !k.default_shown.empty() ? k.default_shown : k.default_value;
}

// docs/json.md, "knobs": one document; a set variable's value, "<secret>" for a secret one.
void print_knobs_json() {
  std::printf("{\n  \"schema\": %d,\n  \"knobs\": [\n", records::kJsonSchema);
  const auto table = knobs::all();
  for (size_t i = 0; i < table.size(); ++i) {
    const auto& k = table[i];
    const std::optional<std::string> now = knobs::current(k);
    std::printf(
        "    {\"name\": %s, \"kind\": %s, \"default\": %s, \"default_shown\": %s, \"who\": %s, \"help\": %s, "
        "\"value\": %s}%s\n",
        json_string(k.name).c_str(), json_string(knobs::kind_text(k)).c_str(),
        k.default_value.empty() ? "null" : json_string(k.default_value).c_str(),
        json_string(shown_default(k)).c_str(), json_string(knobs::readers_text(k.readers)).c_str(),
        json_string(k.help).c_str(), now ? json_string(secret::shown_value(k.name, *now)).c_str() : "null",
        i + 1 < table.size() ? "," : "");
  }
  std::printf("  ]\n}\n");
}

// The terminal's width: $COLUMNS, else the TTY's; 0 (no wrapping) for a pipe.
size_t terminal_width() {
  if (const std::string c = knobs::columns.get(); std::atoi(c.c_str()) > 0)
    return size_t(std::atoi(c.c_str()));
  winsize ws{};
  if (::isatty(1) && ::ioctl(1, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
  return 0;
}

// `text` broken at blanks into lines of at most `width` (0: one line), each after the first
// indented by `indent`, so a long MEANING stays in its column instead of wrapping under VARIABLE.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  if (width == 0 || indent + 20 > width) return text;
  std::string out, line;
  for (const auto& word : text::split(text, ' ')) {
    if (!line.empty() && indent + line.size() + 1 + word.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  return out + line;
}

void print_knobs_table() {
  size_t name_w = 8, default_w = 7, who_w = 3;
  for (const auto& k : knobs::all()) {
    name_w = std::max(name_w, k.name.size());
    default_w = std::max(default_w, shown_default(k).size());
    who_w = std::max(who_w, knobs::readers_text(k.readers).size());
  }
  size_t meaning_at = name_w + 2 + default_w + 2 + who_w + 2, width = terminal_width();
  std::printf("%-*s  %-*s  %-*s  %s\n", int(name_w), "VARIABLE", int(default_w), "DEFAULT", int(who_w), "WHO",
              "MEANING");
  for (const auto& k : knobs::all()) {
    std::string help(k.help);
    if (k.kind != knobs::Kind::string) help += " [" + knobs::kind_text(k) + "]";
    std::printf("%-*.*s  %-*.*s  %-*s  %s\n", int(name_w), int(k.name.size()), k.name.data(), int(default_w),
                int(shown_default(k).size()), shown_default(k).data(), int(who_w),
                knobs::readers_text(k.readers).c_str(), wrap(help, meaning_at, width).c_str());
  }
}

}  // namespace

void register_completions(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::string shell;
  auto* c = app.add_subcommand("completions", "Print the shell completion script for bash, zsh or fish");
  c->add_option("shell", shell, "bash, zsh or fish")->required();
  c->footer(
      "Examples:\n  source <(mltrain completions bash)\n  mltrain completions zsh > ~/.zfunc/_mltrain\n"
      "  mltrain completions fish > ~/.config/fish/completions/mltrain.fish");
  c->callback([&] {
    handler = [&] {
      std::string file = shell == "bash"   ? "mltrain.bash"
                         : shell == "zsh"  ? "_mltrain"
                         : shell == "fish" ? "mltrain.fish"
                                           : "";
      for (int i = 0; i < completions::kEmbeddedCount; ++i)
        if (completions::kEmbedded[i].first == file) {
          std::fwrite(completions::kEmbedded[i].second.data(), 1, completions::kEmbedded[i].second.size(),
                      stdout);
          return 0;
        }
      throw Error(
          "no completions for shell '" + shell + "'" + text::did_you_mean(shell, {"bash", "zsh", "fish"}),
          "choose bash, zsh or fish");
    };
  });
}

void register_knobs(CLI::App& app, Global&, std::function<int()>& handler) {
  static bool json = false;
  auto* c = app.add_subcommand("knobs", "List the environment variables mltrain reads, with defaults");
  c->add_flag("--json", json, "Print the table as one JSON document (docs/json.md)");
  c->footer(
      "WHO reads it: launcher (mltrain itself), agent (on each host), comm (libmltrain-comm in the ranks).\n"
      "Durations read like 90s, 5m, 1h30m (a bare number is seconds); sizes like 64K, 1M, 2G.\n"
      "Examples:\n  mltrain knobs\n  mltrain knobs --json");
  c->callback([&] {
    handler = [] {
      if (json)
        print_knobs_json();
      else
        print_knobs_table();
      return 0;
    };
  });
}

}  // namespace mltrain::cli
