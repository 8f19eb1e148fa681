// GpuSampler: NVML (runner/gpu/nvml.h), else nvidia-smi's CSV queries, else nothing with a reason.
#include <errno.h>
#include <sys/stat.h>
#include <unistd.h>

#include <charconv>
#include <cstring>
#include <memory>

#include "knobs/gpu_library.h"
#include "runner/gpu/nvml.h"
#include "runner/gpu/run_tool.h"
#include "runner/telemetry/detail/reuse.h"
#include "runner/telemetry/detail/text.h"
#include "runner/telemetry/sampler.h"

namespace mltrain::telemetry {
namespace {

constexpr unsigned kMaxGpus = 1024;
constexpr size_t kMaxSmiOutput = 256 * 1024;

// `program` looked up in `path` as execvp would ("" = /usr/bin:/bin); "" when not found.
std::string find_in_path(const char* program, const std::string& path) {
  std::string_view rest = path.empty() ? std::string_view("/usr/bin:/bin") : std::string_view(path);
  bool done = false;
  std::string_view dir;
  while (detail::next_cell(rest, ':', dir, done)) {
    std::string candidate = dir.empty() ? std::string(".") : std::string(dir);
    candidate += '/';
    candidate += program;
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(candidate.c_str(), X_OK) == 0)
      return candidate;
  }
  return {};
}

std::string first_line(std::string_view text) {
  std::string_view line = detail::trim(text.substr(0, text.find('\n')));
  return line.size() > 200 ? std::string(line.substr(0, 200)) + "..." : std::string(line);
}

}  // namespace

struct GpuSampler::Impl {
  GpuSamplerOptions opt;
  bool probed = false;
  std::string source;
  std::string note;
  std::string probe_note;  // what the per-sample note starts from

  std::unique_ptr<gpu::Nvml> nvml;
  std::vector<gpu::Nvml::Device> devices;
  std::vector<std::string> uuids;
  std::vector<gpu::Nvml::Process> processes;

  std::string smi;         // nvidia-smi's path once it answered
  std::string gpu_fields;  // kNvidiaSmiGpuFields plus the reasons field this driver knows
  std::string gpu_query;   // --query-gpu=<gpu_fields>
  std::string apps_query;  // --query-compute-apps=<kNvidiaSmiAppFields>
  std::string out;

  // True when NVML initialised; otherwise `why` says what happened.
  bool open_nvml(std::string& why) {
    gpu::Nvml::Failure failed;
    std::unique_ptr<gpu::Nvml> n = gpu::Nvml::open(opt.nvml_library, failed);
    if (!n) {
      if (failed.step == gpu::Nvml::Failure::Step::load)
        why = failed.named ? failed.error
                           : std::string(knobs::library_default_name(knobs::GpuLibrary::nvml)) + " not found";
      else if (failed.step == gpu::Nvml::Failure::Step::symbols)
        why = failed.file +
              " lacks nvmlInit_v2, nvmlShutdown, nvmlDeviceGetCount_v2 or nvmlDeviceGetHandleByIndex_v2";
      else
        why = "nvmlInit: " + failed.init_error;
      return false;
    }
    unsigned count = 0;
    if (int r = n->device_count(count); r != gpu::Nvml::kSuccess) {
      why = "nvmlDeviceGetCount: " + n->what(r);
      return false;
    }
    nvml = std::move(n);
    std::string errors;
    for (unsigned i = 0; i < count && i < kMaxGpus; ++i) {
      gpu::Nvml::Device dev = nullptr;
      if (int r = nvml->device(i, dev); r != gpu::Nvml::kSuccess) {
        errors += (errors.empty() ? "GPU " : "; GPU ") + std::to_string(i) + ": " + nvml->what(r);
        dev = nullptr;
      }
      std::string uuid;
      if (dev) nvml->uuid(dev, uuid);
      devices.push_back(dev);
      uuids.push_back(std::move(uuid));
    }
    probe_note = count == 0 ? "NVML lists no GPU" : errors;
    return true;
  }

  void sample_nvml(std::vector<GpuSample>& gpus) {
    note.assign(probe_note);
    size_t n = 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      gpu::Nvml::Device dev = devices[i];
      if (!dev) continue;
      GpuSample& g = detail::row_at(gpus, n++);
      g.index = int32_t(i);
      g.uuid.assign(uuids[i]);
      unsigned v = 0;
      // Any error (NOT_SUPPORTED on a MIG-enabled GPU's utilization, NO_PERMISSION, ...) leaves
      // the field empty; a lost GPU is also named in the note.
      if (nvml->utilization(dev, v) == gpu::Nvml::kSuccess) g.util_percent = v;
      gpu::Nvml::Memory m;
      if (int r = nvml->memory(dev, m); r == gpu::Nvml::kSuccess) {
        g.mem_used_mib = m.used >> 20;
        g.mem_total_mib = m.total >> 20;
      } else if (r != gpu::Nvml::kNotSupported) {
        note += note.empty() ? "GPU " : "; GPU ";
        char num[12];
        note.append(num, std::to_chars(num, num + sizeof num, i).ptr);
        note += ": ";
        note += nvml->what(r);
      }
      if (nvml->power_mw(dev, v) == gpu::Nvml::kSuccess) g.power_mw = v;
      if (nvml->power_limit_mw(dev, v) == gpu::Nvml::kSuccess) g.power_limit_mw = v;
      if (nvml->temperature_c(dev, v) == gpu::Nvml::kSuccess) g.temperature_c = v;
      if (nvml->sm_clock_mhz(dev, v) == gpu::Nvml::kSuccess) g.sm_clock_mhz = v;
      unsigned long long reasons = 0;
      if (nvml->clock_reasons(dev, reasons) == gpu::Nvml::kSuccess) g.throttle_reasons = reasons;
      if (nvml->compute_processes(dev, processes) == gpu::Nvml::kSuccess)
        for (const gpu::Nvml::Process& p : processes) {
          GpuProcess q;
          q.pid = p.pid;
          if (p.used_bytes != gpu::Nvml::kValueNotAvailable) q.used_mib = p.used_bytes >> 20;
          g.processes.push_back(q);
        }
    }
    gpus.resize(n);
  }

  // Runs nvidia-smi with one --query argument. The exit status as run_capture returns it.
  int run_smi(const std::string& query) {
    const char* argv[] = {smi.c_str(), query.c_str(), "--format=csv,noheader,nounits", nullptr};
    return gpu::run_tool(argv, opt.nvidia_smi_timeout_ms, kMaxSmiOutput, out);
  }

  std::string failure(int status) const {
    if (status == gpu::kToolNotStarted) return "cannot run " + smi + ": " + std::strerror(errno);
    if (status == gpu::kToolTimedOut)
      return smi + " did not answer within " + std::to_string(opt.nvidia_smi_timeout_ms) + " ms";
    std::string said = first_line(out);
    return smi + " exit " + std::to_string(gpu::tool_exit_code(status)) +
           (said.empty() ? "" : " (" + said + ")");
  }

  void set_reasons_field(const char* field) {
    gpu_fields.assign(kNvidiaSmiGpuFields);
    gpu_fields += ',';
    gpu_fields += field;
    gpu_query.assign("--query-gpu=");
    gpu_query += gpu_fields;
  }

  // True when nvidia-smi answered the query (the reasons field retried under its older name).
  bool open_smi(std::string& why) {
    smi = find_in_path("nvidia-smi", opt.path);
    if (smi.empty()) {
      why = "nvidia-smi not in PATH";
      return false;
    }
    set_reasons_field(kNvidiaSmiReasonsField);
    apps_query.assign("--query-compute-apps=");
    apps_query += kNvidiaSmiAppFields;
    int status = run_smi(gpu_query);
    if (gpu::tool_exit_code(status) != 0 && out.find(kNvidiaSmiReasonsField) != std::string::npos &&
        out.find("not a valid field") != std::string::npos) {
      set_reasons_field(kNvidiaSmiOldReasonsField);  // a driver before R535
      status = run_smi(gpu_query);
    }
    if (gpu::tool_exit_code(status) != 0) {
      why = failure(status);
      return false;
    }
    return true;
  }

  void sample_smi(std::vector<GpuSample>& gpus) {
    int status = run_smi(gpu_query);
    if (gpu::tool_exit_code(status) != 0) {
      gpus.clear();
      note = failure(status);
      return;
    }
    parse_nvidia_smi_gpus(out, gpu_fields, gpus);
    note.assign(probe_note);
    status = run_smi(apps_query);
    if (gpu::tool_exit_code(status) == 0)
      parse_nvidia_smi_apps(out, kNvidiaSmiAppFields, gpus);
    else
      note += (note.empty() ? "" : "; ") + failure(status);
  }

  void probe() {
    probed = true;
    std::string nvml_why, smi_why;
    if (opt.use_nvml && open_nvml(nvml_why)) {
      source = "nvml";
      return;
    }
    if (!opt.use_nvml) nvml_why = "NVML not used";
    if (opt.use_nvidia_smi && open_smi(smi_why)) {
      source = "nvidia-smi";
      probe_note = nvml_why;  // why the costlier fallback is in use
      return;
    }
    if (!opt.use_nvidia_smi) smi_why = "nvidia-smi not used";
    probe_note = "no GPU telemetry: " + nvml_why + ", " + smi_why;
  }
};

GpuSampler::GpuSampler(GpuSamplerOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  if (impl_->opt.nvidia_smi_timeout_ms <= 0) impl_->opt.nvidia_smi_timeout_ms = 5000;
}

GpuSampler::~GpuSampler() = default;

void GpuSampler::sample(std::vector<GpuSample>& gpus) {
  Impl& m = *impl_;
  if (!m.probed) m.probe();
  if (m.source == "nvml") {
    m.sample_nvml(gpus);
  } else if (m.source == "nvidia-smi") {
    m.sample_smi(gpus);
  } else {
    gpus.clear();
    m.note.assign(m.probe_note);
  }
}

const std::string& GpuSampler::source() const { return impl_->source; }
const std::string& GpuSampler::note() const { return impl_->note; }

}  // namespace mltrain::telemetry
