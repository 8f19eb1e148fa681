// `mltrain export`: flags -> launch::JobRequest -> launch::export_manifest -> the YAML on stdout.
#include <CLI/CLI.hpp>
#include <cstdio>

#include "cli/commands.h"
#include "cli/job_flags.h"
#include "runner/common/text.h"
#include "runner/launch/launch.h"

namespace mltrain::cli {
namespace {

struct ExportFlags {
  std::vector<std::string> positional;
  std::string to;
  launch::Overrides overrides;
};

int do_export(const ExportFlags& f, const Global& g) {
  launch::JobRequest req;
  req.specs = f.positional;
  if (g.has_trailing) req.command = g.trailing;
  req.overrides = f.overrides;
  std::vector<std::string> warnings;
  std::fputs(launch::export_manifest(req, f.to, &warnings).c_str(), stdout);
  for (const auto& w : warnings)
    std::fprintf(stderr, "mltrain: warning: %s\n", mltrain::text::host_text(w).c_str());
  return 0;
}

}  // namespace

void register_export(CLI::App& app, Global& g, std::function<int()>& handler) {
  static ExportFlags f;
  auto* c =
      app.add_subcommand("export", "Print a job spec as a Kubernetes manifest (Volcano Job or PyTorchJob)");
  c->add_option("job", f.positional, "Job spec (TOML) with a [k8s] table");
  c->add_option("--to", f.to, "What to write: volcano (a Volcano Job) or pytorchjob (a Kubeflow PyTorchJob)")
      ->required();
  add_host_flags(c, f.overrides);
  add_job_flags(c, f.overrides);
  c->footer(
      "Examples:\n"
      "  mltrain export --to volcano job.toml | kubectl apply -f -\n"
      "  mltrain export --to pytorchjob job.toml > job.yaml\n"
      "  mltrain export --to volcano job.toml --procs-per-host 8 --max-restarts 2\n"
      "One pod per node, procs_per_host ranks in each (through torchrun when more than one); [k8s] gives\n"
      "the image, resources and pod count. Secret-looking variables come from the Secret <name>-env;\n"
      "their values are never printed. Exit code 2 and a file:line:column message for a spec that\n"
      "cannot be exported (docs/k8s.md).");
  c->callback([&] { handler = [&] { return do_export(f, g); }; });
}

}  // namespace mltrain::cli
