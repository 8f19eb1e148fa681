// `mltrain logs`, `ls`, `show`, `stop`: views of run records.
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/records/views.h"

namespace mltrain::cli {

void register_logs(CLI::App& app, Global& g, std::function<int()>& handler) {
  static struct {
    std::string id, ranks, grep;
    bool follow = false, no_prefix = false;
    int tail = -1;
  } f;
  auto* c = app.add_subcommand("logs", "Print a run's logs (the latest run by default)");
  c->add_option("id", f.id, "Run id, a unique part of it, or 'latest'");
  c->add_flag("-f,--follow", f.follow, "Keep printing new lines until the run ends");
  c->add_option("-r,--rank", f.ranks, "Only these ranks, e.g. 0,3-5");
  c->add_option("-g,--grep", f.grep, "Only lines matching this regular expression");
  c->add_option("-t,--tail", f.tail, "Only the last N lines of each rank")->check(CLI::NonNegativeNumber);
  c->add_flag("--no-prefix", f.no_prefix, "Print lines without the [rank] prefix");
  c->footer(
      "Examples:\n  mltrain logs                 the latest run, every rank\n"
      "  mltrain logs -f 20261129     follow a run\n  mltrain logs --rank 0,3 --grep loss --tail 20");
  c->callback([&] {
    handler = [&] {
      records::LogsOptions o;
      o.id = f.id;
      o.follow = f.follow;
      o.grep = f.grep;
      o.tail = f.tail;
      o.prefix = !f.no_prefix;
      o.color = use_color(g, 1);
      if (!f.ranks.empty()) {
        auto list = text::parse_int_list(f.ranks);
        if (!list) throw Error("--rank '" + f.ranks + "' is not a rank list", "write ranks like 0,3-5");
        o.ranks = std::set<int>(list->begin(), list->end());
      }
      return records::print_logs(o);
    };
  });
}

void register_ls(CLI::App& app, Global&, std::function<int()>& handler) {
  static bool json = false;
  auto* c = app.add_subcommand("ls", "List recorded runs, oldest first");
  c->add_flag("--json", json, "Print the runs as a JSON array");
  c->footer("Example:\n  mltrain ls\nRuns live in $MLTRAIN_HOME/runs (default ~/.local/state/mltrain/runs).");
  c->callback([&] {
    handler = [&] {
      records::print_list(json);
      return 0;
    };
  });
}

void register_show(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::string id;
  static bool json = false;
  auto* c = app.add_subcommand("show", "Show one run: command, hosts, ranks and how each ended");
  c->add_option("id", id, "Run id, a unique part of it, or 'latest'");
  c->add_flag("--json", json, "Print the run record (run.json)");
  c->footer("Example:\n  mltrain show latest");
  c->callback([&] {
    handler = [&] {
      records::print_show(id, json);
      return 0;
    };
  });
}

void register_stop(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::string id;
  auto* c = app.add_subcommand(
      "stop", "Stop a running job (every rank gets SIGTERM, then SIGKILL after the grace period)");
  c->add_option("id", id, "Run id, a unique part of it, or 'latest'");
  c->footer("Example:\n  id=$(mltrain run -d job.toml); mltrain stop $id");
  c->callback([&] { handler = [&] { return records::stop_run(id); }; });
}

}  // namespace mltrain::cli
