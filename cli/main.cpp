// mltrain: a thin main. Subcommands come from a table; every error reaches one handler that
// prints it and maps it to a documented exit code (docs/exit-codes.md).
#include <fcntl.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "config.h"
#include "knobs/knobs.h"
#include "runner/common/error.h"
#include "runner/common/log.h"
#include "runner/common/text.h"

namespace mltrain::cli {

bool use_color(const Global& g, int fd) {
  if (g.color == "always") return true;
  if (g.color == "never") return false;
  if (knobs::no_color.is_set()) return false;
  if (knobs::term.get() == "dumb") return false;
  return ::isatty(fd);
}

namespace {

const Register kCommands[] = {
    register_run,   register_validate, register_logs,   register_ls,    register_show,        register_stop,
    register_rm,    register_gc,       register_doctor, register_bench, register_completions, register_knobs,
    register_top,   register_exec,     register_ssh,    register_cp,    register_export,      register_sbatch,
    register_queue, register_rerun,    register_diff,   register_sweep};

int run_main(int argc, char** argv) {
  Global g;
  // A literal "--" ends mltrain's own arguments: the rest is the command to run, untouched.
  std::vector<std::string> args(argv + 1, argv + argc);
  for (size_t i = 0; i < args.size(); ++i)
    if (args[i] == "--") {
      g.trailing.assign(args.begin() + long(i) + 1, args.end());
      g.has_trailing = true;
      args.resize(i);
      break;
    }
  translate_peer_flags(args);

  CLI::App app{
      "mltrain: start a training job's ranks on one or more hosts, stream their logs, stop them together.",
      "mltrain"};
  app.set_version_flag("--version",
                       std::string("mltrain ") + MLTRAIN_VERSION + " (" + MLTRAIN_GIT_COMMIT + ")");
  app.require_subcommand(1);
  app.fallthrough();
  app.add_flag("-v,--verbose", g.verbose, "More diagnostics on stderr (repeat for debug)");
  app.add_option("--color", g.color, "Colour rank prefixes: auto, always, never")
      ->check(CLI::IsMember({"auto", "always", "never"}));
  app.footer(
      "Examples:\n"
      "  mltrain run -n 4 -- python3 train.py     4 ranks on this machine\n"
      "  mltrain run examples/hello.toml          a job spec\n"
      "  mltrain logs -f                          follow the latest run\n"
      "Docs: docs/spec.md, docs/exit-codes.md. Exit codes: 0 ok, 2 bad input, a failed rank's own code.");

  std::function<int()> handler;
  for (auto reg : kCommands) reg(app, g, handler);

  std::vector<std::string> reversed(args.rbegin(), args.rend());
  try {
    app.parse(reversed);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line, like every other error, with a suggestion for a mistyped verb.
    std::vector<std::string> verbs;
    for (const auto* sub : app.get_subcommands({})) verbs.push_back(sub->get_name());
    std::string first;
    for (const auto& a : args)
      if (!a.empty() && a[0] != '-') {
        first = a;
        break;
      }
    bool known = std::find(verbs.begin(), verbs.end(), first) != verbs.end();
    std::string msg = e.what();
    std::string hint = "see mltrain --help";
    if (!first.empty() && !known) {
      msg = "unknown command '" + first + "'" + text::did_you_mean(first, verbs);
      hint = "commands: " + text::join(verbs, ", ");
    } else if (known) {
      hint = "see mltrain " + first + " --help";
      // "The following argument was not expected: --nproc": suggest the flag meant.
      auto colon = msg.rfind(": ");
      std::string bad = colon == std::string::npos ? "" : text::trim(msg.substr(colon + 2));
      if (!bad.empty() && bad[0] == '-') {
        std::vector<std::string> flags;
        for (const auto* opt : app.get_subcommand(first)->get_options()) {
          for (const auto& l : opt->get_lnames()) flags.push_back("--" + l);
          for (const auto& sn : opt->get_snames()) flags.push_back("-" + sn);
        }
        std::string word = bad.substr(0, bad.find('='));
        msg = "unknown flag '" + word + "' for 'mltrain " + first + "'" + text::did_you_mean(word, flags);
      }
    }
    throw Error(msg, hint, exit_code::usage);
  }
  if (std::string bad = log::set_level_from_env(); !bad.empty())
    std::fprintf(stderr, "mltrain: warning: %s; ignored\n", bad.c_str());
  if (g.verbose == 1) log::set_level(log::Level::info);
  if (g.verbose >= 2) log::set_level(log::Level::debug);
  if (g.has_trailing && !handler) return exit_code::usage;
  return handler ? handler() : exit_code::usage;
}

}  // namespace

// An error's text as the terminal gets it: its lines kept, anything in them a host sent (or a
// file held) that a terminal would act on escaped.
std::string shown(const char* what) {
  std::vector<std::string> lines = text::split(what, '\n');
  for (auto& l : lines) l = text::host_text(l);
  return text::join(lines, "\n");
}

}  // namespace mltrain::cli

int main(int argc, char** argv) {
  using namespace mltrain;
  // A closed stdin, stdout or stderr would be taken by the next file opened (a rank log, an
  // agent's pipe), and --stdin would then read, or output land, there: fill them with /dev/null.
  for (int fd = 0; fd < 3; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY) < 0) return 255;
  try {
    return cli::run_main(argc, argv);
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "mltrain: error: %s\n", cli::shown(e.what()).c_str());
    if (!e.hint().empty()) std::fprintf(stderr, "mltrain: hint: %s\n", cli::shown(e.hint().c_str()).c_str());
    return e.code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "mltrain: fatal: out of memory\n");
    return exit_code::internal;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "mltrain: internal error: %s (please report this as a bug)\n",
                 cli::shown(e.what()).c_str());
    return exit_code::internal;
  }
}
