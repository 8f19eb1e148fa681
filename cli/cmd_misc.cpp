// `mltrain completions` and `mltrain knobs`.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "runner/common/error.h"
#include "runner/common/text.h"

namespace mltrain::cli {

namespace completions {
extern const std::pair<std::string_view, std::string_view> kEmbedded[];
extern const int kEmbeddedCount;
}  // namespace completions

namespace {

struct Knob {
  const char* name;
  const char* default_value;
  const char* help;
};

// Every environment variable mltrain itself reads, in one place.
const Knob kKnobs[] = {
    {"MLTRAIN_HOME", "$XDG_STATE_HOME/mltrain or ~/.local/state/mltrain", "where run records and the agent cache live"},
    {"MLTRAIN_LOG", "warn", "diagnostics on stderr: debug, info, warn, error, off"},
    {"NO_COLOR", "(unset)", "set to anything to turn off coloured rank prefixes"},
    {"XDG_CONFIG_HOME", "~/.config", "user profiles are read from $XDG_CONFIG_HOME/mltrain/profiles/NAME.toml"},
    {"SLURM_JOB_NODELIST", "(unset)", "inside a Slurm allocation with no hosts given, the hosts to use"},
    {"MLTRAIN_COMM_TIMEOUT", "300s", "comm library: timeout of every blocking call (see docs/comm.md)"},
};

}  // namespace

void register_completions(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::string shell;
  auto* c = app.add_subcommand("completions", "Print the shell completion script for bash, zsh or fish");
  c->add_option("shell", shell, "bash, zsh or fish")->required();
  c->footer("Examples:\n  source <(mltrain completions bash)\n  mltrain completions zsh > ~/.zfunc/_mltrain\n"
            "  mltrain completions fish > ~/.config/fish/completions/mltrain.fish");
  c->callback([&] {
    handler = [&] {
      std::string file = shell == "bash" ? "mltrain.bash" : shell == "zsh" ? "_mltrain" : shell == "fish" ? "mltrain.fish" : "";
      for (int i = 0; i < completions::kEmbeddedCount; ++i)
        if (completions::kEmbedded[i].first == file) {
          std::fwrite(completions::kEmbedded[i].second.data(), 1, completions::kEmbedded[i].second.size(), stdout);
          return 0;
        }
      throw Error("no completions for shell '" + shell + "'" + text::did_you_mean(shell, {"bash", "zsh", "fish"}),
                  "choose bash, zsh or fish");
    };
  });
}

void register_knobs(CLI::App& app, Global&, std::function<int()>& handler) {
  auto* c = app.add_subcommand("knobs", "List the environment variables mltrain reads, with defaults");
  c->footer("Example:\n  mltrain knobs");
  c->callback([&] {
    handler = [] {
      std::printf("%-20s %-10s %s\n", "VARIABLE", "NOW", "DEFAULT / MEANING");
      for (const auto& k : kKnobs) {
        const char* v = std::getenv(k.name);
        std::printf("%-20s %-10s %s: %s\n", k.name, v ? v : "-", k.default_value, k.help);
      }
      return 0;
    };
  });
}

}  // namespace mltrain::cli
