// `mltrain logs`, `ls`, `show`, `stop`, `rm`, `gc`: views of run records and their cleanup.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "runner/common/error.h"
#include "runner/common/text.h"
#include "runner/launch/launch.h"
#include "runner/records/cleanup.h"
#include "runner/records/views.h"

namespace mltrain::cli {

namespace {

// A run id given as '' names no run (left out, the verb takes the newest): never a guess.
void no_empty_run_id(const std::string& v) {
  if (v.empty())
    throw Error("an empty run id names no run",
                "give a run id or a unique part of it ('mltrain ls' lists them), or 'latest'");
}

}  // namespace

void register_logs(CLI::App& app, Global& g, std::function<int()>& handler) {
  static struct {
    std::string id, ranks, grep;
    bool follow = false, no_prefix = false, by_rank = false;
    int tail = -1;
  } f;
  auto* c = app.add_subcommand("logs", "Print a run's logs (the latest run by default)");
  c->add_option("id", f.id, "Run id, a unique part of it, or 'latest'")->each(no_empty_run_id);
  c->add_flag("-f,--follow", f.follow, "Keep printing new lines until the run ends");
  c->add_option("-r,--rank", f.ranks, "Only these ranks, e.g. 0,3-5");
  c->add_option("-g,--grep", f.grep, "Only lines matching this regular expression");
  add_int_option(c, "-t,--tail", f.tail, 0, INT32_MAX, "Only the last N lines of each rank");
  c->add_flag("--no-prefix", f.no_prefix, "Print lines without the [rank] prefix");
  c->add_flag("--by-rank", f.by_rank,
              "Each rank's lines together, rank by rank (default: merged as they arrived)");
  c->footer(
      "Lines carry the prefix the live console showed ([h1:0] on a multi-host run) and come merged\n"
      "in the order they arrived, as the console showed them.\n"
      "Into a pipe or a file, logs are the exact bytes each rank wrote (after the prefix); on a\n"
      "terminal they are escaped as the console escapes them (control bytes and invalid UTF-8 as\n"
      "\\xNN). The console itself is never exact: it escapes control bytes wherever it goes\n"
      "(docs/spec.md, \"Console output\").\n"
      "Examples:\n  mltrain logs                 the latest run, every rank\n"
      "  mltrain logs -f 20261129     follow a run\n  mltrain logs --rank 0,3 --grep loss --tail 20\n"
      "Exit code: 0; with -f, the run's own exit code once it ends (docs/exit-codes.md).");
  c->callback([&] {
    handler = [&] {
      records::LogsOptions o;
      o.id = f.id;
      o.follow = f.follow;
      o.grep = f.grep;
      o.tail = f.tail;
      o.prefix = !f.no_prefix;
      o.by_rank = f.by_rank;
      o.terminal = ::isatty(1) == 1;
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
  static records::ListOptions o;
  auto* c = app.add_subcommand("ls", "List recorded runs, newest first; find and export them");
  c->add_flag("--json", o.json,
              "Print the runs as one JSON object: {\"schema\": 1, \"runs\": [run, ...]} (docs/json.md)");
  c->add_flag("--jsonl", o.jsonl,
              "One JSON object per run and line, for pandas or DuckDB: its record and metrics_last, or the "
              "--columns");
  c->add_option("--where", o.where,
                "Only the runs where FIELD OP VALUE holds; 'and', 'or'; OP: < <= > >= = != ~ (regex)");
  c->add_option("--columns", o.columns, "The table's (or --jsonl's) fields, comma-separated");
  c->add_option_function<std::string>(
       "-n,--newest", [](const std::string& v) { o.newest = int(text::parse_int_arg(v, "-n", 1, 1 << 30)); },
       "Only the newest N runs (of those --where keeps)")
      ->type_name("N");
  c->footer(
      "Fields: id name status kind exit ranks hosts started ended duration restarts git rerun_of spec,\n"
      "metric.NAME (its last value), metric.NAME.first|min|max|last|count, env.KEY (os kernel python torch "
      "...)\n"
      "Examples:\n  mltrain ls\n  mltrain ls --where 'metric.loss < 0.3' --columns "
      "name,metric.loss,duration\n"
      "  mltrain ls --jsonl > runs.jsonl        # pandas.read_json('runs.jsonl', lines=True)\n"
      "Runs live in $MLTRAIN_HOME/runs (default ~/.local/state/mltrain/runs); docs/records.md.");
  c->callback([&] {
    handler = [&] {
      if (o.json && o.jsonl) throw Error("--json and --jsonl do not go together", "choose one");
      records::print_list(o);
      return 0;
    };
  });
}

void register_show(CLI::App& app, Global& g, std::function<int()>& handler) {
  static std::string id;
  static bool json = false;
  auto* c = app.add_subcommand("show", "Show one run: command, hosts, ranks, how each ended, its metrics");
  c->add_option("id", id, "Run id, a unique part of it, or 'latest'")->each(no_empty_run_id);
  c->add_flag("--json", json, "Print the run record (run.json)");
  c->footer("Example:\n  mltrain show latest");
  c->callback([&] {
    handler = [&] {
      records::print_show(id, json, use_color(g, 1));
      return 0;
    };
  });
}

void register_diff(CLI::App& app, Global& g, std::function<int()>& handler) {
  static std::string a, b;
  static bool json = false;
  auto* c = app.add_subcommand("diff", "What changed between two runs: record, metrics, spec and code");
  c->add_option("a", a, "A run id, a unique part of it, or 'latest'")->required()->each(no_empty_run_id);
  c->add_option("b", b, "The other run")->required()->each(no_empty_run_id);
  c->add_flag("--json", json, "Print the comparison as one JSON document (docs/json.md)");
  c->footer(
      "Rows that differ are marked *. The spec is compared as recorded; the code from what each run kept\n"
      "(docs/records.md): files changed, added and removed, and a unified diff of the text files.\n"
      "Example:\n  mltrain diff 20261129-141502-hello-3fa2 latest");
  c->callback(
      [&] { handler = [&] { return records::print_diff(a, b, json, ::isatty(1) == 1, use_color(g, 1)); }; });
}

void register_stop(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::string id;
  auto* c = app.add_subcommand(
      "stop", "Stop a running job (every rank gets SIGTERM, then SIGKILL after the grace period)");
  c->add_option("id", id, "Run id, a unique part of it, or 'latest'")->each(no_empty_run_id);
  c->footer("Example:\n  id=$(mltrain run -d job.toml); mltrain stop $id");
  c->callback([&] { handler = [&] { return records::stop_run(id); }; });
}

void register_rm(CLI::App& app, Global&, std::function<int()>& handler) {
  static std::vector<std::string> ids;
  auto* c = app.add_subcommand("rm", "Remove the records of ended runs (never a running one)");
  c->add_option("id", ids, "Run ids, unique parts of them, or 'latest'")->required()->each(no_empty_run_id);
  c->footer(
      "Each id follows the rule of show/logs/stop: exact id, else a unique prefix; an id that\n"
      "matches several runs is refused. Nothing is removed unless every id names an ended run.\n"
      "Example:\n  mltrain rm 20261129-141502-hello-3fa2");
  c->callback([&] { handler = [&] { return records::remove_runs(ids); }; });
}

// `gc --hosts`: the synced folders on the hosts no run uses any more.
int gc_hosts(const std::vector<std::string>& job, const launch::Overrides& overrides, const Global& g,
             std::chrono::milliseconds older_than, bool dry_run) {
  launch::JobRequest r;
  r.specs = job;
  r.overrides = overrides;
  r.color = use_color(g, 1);
  launch::GcHostsResult res =
      launch::gc_hosts(r, std::chrono::duration_cast<std::chrono::seconds>(older_than), dry_run);
  std::fputs(supervise::format_gc_hosts(res.hosts, dry_run).c_str(), stdout);
  return res.exit_code;
}

void register_gc(CLI::App& app, Global& g, std::function<int()>& handler) {
  static std::string older_than;
  static int keep = -1;
  static bool dry_run = false, hosts = false;
  static std::vector<std::string> job;
  static launch::Overrides overrides;
  auto* c = app.add_subcommand(
      "gc", "Remove old run records (never a running run's); with --hosts, synced folders");
  c->add_option("--older-than", older_than,
                "Only runs started (folders synced) longer ago than this (e.g. 7d, 12h)");
  add_int_option(c, "--keep", keep, 0, INT32_MAX, "Always keep the newest N runs");
  c->add_flag("--dry-run", dry_run, "Only list what would be removed");
  c->add_flag("--hosts", hosts,
              "Remove the synced folders on the hosts (~/.cache/mltrain/work/*) that no run uses any more, "
              "instead of run records: the hosts of JOB.toml, -H or --hostfile");
  c->add_option("job", job, "With --hosts: the job spec whose hosts to clean");
  // The hosts as the job verbs take them, but for -H's long name: here --hosts says what to clean.
  c->add_option_function<std::string>(
      "-H", [](const std::string& v) { overrides.hosts = v; }, "With --hosts: the hosts, e.g. 'a,b'");
  c->add_option("--hostfile", overrides.hostfile, "With --hosts: a hostfile");
  c->add_option("--ssh-config", overrides.ssh_config, "ssh config file (default ~/.ssh/config)");
  c->footer(
      "With both options, a run goes when it is older than the limit and not among the newest N.\n"
      "With --hosts, each host's agent removes this user's synced folders that no running job uses and\n"
      "none synced within --older-than (what jobs wrote in them goes too: pull it first).\n"
      "Examples:\n  mltrain gc --older-than 7d\n  mltrain gc --keep 20 --dry-run\n"
      "  mltrain gc --hosts job.toml --older-than 14d --dry-run");
  c->callback([&] {
    handler = [&] {
      std::chrono::milliseconds limit{0};
      if (!older_than.empty()) {
        auto d = text::parse_duration(older_than);
        if (!d)
          throw Error("--older-than '" + older_than + "' is not a duration", "write it like 7d, 12h or 90m");
        limit = *d;
      }
      if (hosts) {
        if (keep >= 0)
          throw Error("--keep counts run records; with --hosts use --older-than", {}, exit_code::usage);
        return gc_hosts(job, overrides, g, limit, dry_run);
      }
      if (!job.empty() || overrides.hosts || !overrides.hostfile.empty())
        throw Error("gc without --hosts cleans run records on this machine; hosts and specs are for --hosts",
                    "add --hosts to clean the synced folders on the hosts", exit_code::usage);
      records::GcOptions o;
      if (!older_than.empty()) o.older_than = limit;
      if (keep >= 0) o.keep = keep;
      o.dry_run = dry_run;
      return records::gc_runs(o);
    };
  });
}

}  // namespace mltrain::cli
