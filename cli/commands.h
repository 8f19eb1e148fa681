// The subcommand table: each entry adds its CLI11 subcommand and a handler that returns the
// exit code. No logic lives here; handlers call into runner/.
#pragma once

#include <functional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace mltrain::cli {

struct Global {
  int verbose = 0;
  std::string color = "auto";  // auto | always | never
  // Everything after a literal "--" on the command line (the ad-hoc command of `run`).
  std::vector<std::string> trailing;
  bool has_trailing = false;
};

// Registers a subcommand on `app`; stores into `handler` what to run when it is chosen.
using Register = void (*)(CLI::App& app, Global& g, std::function<int()>& handler);

void register_run(CLI::App& app, Global& g, std::function<int()>& handler);
void register_validate(CLI::App& app, Global& g, std::function<int()>& handler);
void register_logs(CLI::App& app, Global& g, std::function<int()>& handler);
void register_ls(CLI::App& app, Global& g, std::function<int()>& handler);
void register_show(CLI::App& app, Global& g, std::function<int()>& handler);
void register_stop(CLI::App& app, Global& g, std::function<int()>& handler);
void register_rm(CLI::App& app, Global& g, std::function<int()>& handler);
void register_gc(CLI::App& app, Global& g, std::function<int()>& handler);
void register_completions(CLI::App& app, Global& g, std::function<int()>& handler);
void register_doctor(CLI::App& app, Global& g, std::function<int()>& handler);
void register_queue(CLI::App& app, Global& g, std::function<int()>& handler);
void register_rerun(CLI::App& app, Global& g, std::function<int()>& handler);
void register_diff(CLI::App& app, Global& g, std::function<int()>& handler);
void register_bench(CLI::App& app, Global& g, std::function<int()>& handler);
void register_knobs(CLI::App& app, Global& g, std::function<int()>& handler);
void register_exec(CLI::App& app, Global& g, std::function<int()>& handler);
void register_ssh(CLI::App& app, Global& g, std::function<int()>& handler);
void register_top(CLI::App& app, Global& g, std::function<int()>& handler);
void register_cp(CLI::App& app, Global& g, std::function<int()>& handler);
void register_sweep(CLI::App& app, Global& g, std::function<int()>& handler);
void register_sbatch(CLI::App& app, Global& g, std::function<int()>& handler);
void register_export(CLI::App& app, Global& g, std::function<int()>& handler);

// Whether console output should be coloured (flag, NO_COLOR, TTY).
bool use_color(const Global& g, int fd);

}  // namespace mltrain::cli
