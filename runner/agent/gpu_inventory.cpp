#include "runner/agent/gpu_inventory.h"

#include <cctype>
#include <cerrno>
#include <cstring>
#include <memory>

#include "runner/agent/preflight.h"
#include "runner/gpu/nvml.h"
#include "runner/gpu/run_tool.h"

namespace mltrain::agent {
namespace {

constexpr int kNvidiaSmiTimeoutMs = 10000;
constexpr size_t kNvidiaSmiMaxOutput = 64 * 1024;

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

std::string trim(std::string s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return s.substr(b, e - b);
}

bool all_digits(const std::string& s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

std::string lower(std::string s) {
  for (auto& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) out += (i ? sep : "") + v[i];
  return out;
}

// True when NVML answered (whatever it counted); else `why` and `no_driver` say what happened.
bool probe_nvml(const std::string& library, GpuInventory& inv, std::vector<std::string>& why,
                bool& no_driver) {
  gpu::Nvml::Failure failed;
  std::unique_ptr<gpu::Nvml> nvml = gpu::Nvml::open(library, failed);
  if (!nvml) {
    const std::string lib_name = failed.file.empty() ? std::string(kDefaultNvmlLibrary) : failed.file;
    if (failed.step == gpu::Nvml::Failure::Step::load) {
      std::string err = failed.error.empty() ? "unknown error" : failed.error;
      if (!failed.named) {
        why.push_back(lib_name + " not found");
      } else {
        // dlerror() starts with the path; say where the path came from instead.
        if (err.compare(0, lib_name.size() + 2, lib_name + ": ") == 0) err.erase(0, lib_name.size() + 2);
        why.push_back("MLTRAIN_NVML_LIBRARY=" + lib_name + ": " + err);
        no_driver = false;
      }
    } else if (failed.step == gpu::Nvml::Failure::Step::symbols) {
      why.push_back(lib_name + " lacks " + failed.missing);
      no_driver = false;
    } else {
      why.push_back("nvmlInit: " + failed.init_error);
      if (failed.code != gpu::Nvml::kDriverNotLoaded) no_driver = false;
    }
    return false;
  }
  inv.library = nvml->found_text();
  inv.source = "nvml";
  std::vector<std::string> errors;
  nvml->driver_version(inv.driver_version);
  if (int cuda = 0; nvml->cuda_driver_version(cuda) == gpu::Nvml::kSuccess && cuda > 0)
    inv.cuda_version = std::to_string(cuda / 1000) + "." + std::to_string(cuda % 1000 / 10);
  unsigned count = 0;
  if (int r = nvml->device_count(count); r != gpu::Nvml::kSuccess) {
    errors.push_back("nvmlDeviceGetCount: " + nvml->what(r));
    count = 0;
  }
  std::vector<gpu::Nvml::Process> procs;
  for (unsigned i = 0; i < count && i < 1024; ++i) {
    gpu::Nvml::Device dev = nullptr;
    if (int r = nvml->device(i, dev); r != gpu::Nvml::kSuccess) {
      errors.push_back("GPU " + std::to_string(i) + ": " + nvml->what(r));
      continue;
    }
    Gpu g;
    g.index = int32_t(i);
    nvml->name(dev, g.name);
    nvml->uuid(dev, g.uuid);
    gpu::Nvml::Memory mem;
    if (nvml->memory(dev, mem) == gpu::Nvml::kSuccess) g.memory_mib = mem.total >> 20;
    unsigned current = 0, pending = 0;
    const int r = nvml->mig_mode(dev, current, pending);
    if (r != gpu::Nvml::kFunctionNotFound)
      g.mig = r == gpu::Nvml::kSuccess ? (current ? 1 : 0) : r == gpu::Nvml::kNotSupported ? 0 : -1;
    // In the same session: a claim must not pick a GPU someone computes on (docs/sharing.md).
    if (nvml->compute_processes(dev, procs) == gpu::Nvml::kSuccess && !procs.empty())
      inv.busy.push_back(int(i));
    inv.gpus.push_back(std::move(g));
  }
  if (count == 0 && errors.empty()) errors.push_back("NVML lists no GPU");
  inv.note = join(errors, "; ");
  return true;
}

std::string first_line(const std::string& text) {
  std::string line = trim(text.substr(0, text.find('\n')));
  return line.size() > 200 ? line.substr(0, 200) + "..." : line;
}

bool probe_nvidia_smi(const std::string& path, GpuInventory& inv, std::vector<std::string>& why,
                      bool& no_driver) {
  std::string program;
  auto fs = real_file_system();
  for (const auto& candidate : program_candidates("nvidia-smi", "", path))
    if (fs.is_executable_file(candidate)) {
      program = candidate;
      break;
    }
  if (program.empty()) {
    why.push_back("nvidia-smi not in PATH");
    return false;
  }
  std::string out;
  const char* argv[] = {program.c_str(), "-L", nullptr};
  int status = gpu::run_tool(argv, kNvidiaSmiTimeoutMs, kNvidiaSmiMaxOutput, out);
  if (status == gpu::kToolNotStarted) {
    why.push_back("cannot run " + program + ": " + std::strerror(errno));
    no_driver = false;
    return false;
  }
  if (status == gpu::kToolTimedOut) {
    why.push_back(program + " -L did not answer within " + std::to_string(kNvidiaSmiTimeoutMs / 1000) + " s");
    no_driver = false;
    return false;
  }
  int code = gpu::tool_exit_code(status);
  std::vector<Gpu> gpus = code == 0 ? parse_nvidia_smi_list(out) : std::vector<Gpu>{};
  if (gpus.empty()) {
    std::string said = first_line(out);
    // Exit 9 is nvidia-smi's "couldn't communicate with the NVIDIA driver".
    if (code != 9) no_driver = false;
    why.push_back("nvidia-smi -L " +
                  (code == 0 ? std::string("lists no GPU") : "exit " + std::to_string(code)) +
                  (said.empty() ? "" : " (" + said + ")"));
    return false;
  }
  inv.source = "nvidia-smi";
  inv.gpus = std::move(gpus);
  return true;
}

}  // namespace

std::vector<Gpu> parse_nvidia_smi_list(const std::string& text) {
  std::vector<Gpu> gpus;
  size_t start = 0;
  bool in_gpu = false;  // the lines after a GPU line belong to it
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    std::string line = trim(text.substr(start, end == std::string::npos ? std::string::npos : end - start));
    start = end == std::string::npos ? text.size() + 1 : end + 1;
    if (line.compare(0, 4, "MIG ") == 0 || line.compare(0, 4, "MIG\t") == 0) {
      if (in_gpu && line.find("Device") != std::string::npos) gpus.back().mig = 1;
      continue;
    }
    // "GPU <index>: <name> (UUID: <uuid>)", spaces around each part tolerated.
    if (line.compare(0, 3, "GPU") != 0 || line.size() < 5 || !is_space(line[3])) {
      in_gpu = false;
      continue;
    }
    size_t colon = line.find(':');
    if (colon == std::string::npos) {
      in_gpu = false;
      continue;
    }
    std::string index = trim(line.substr(3, colon - 3));
    if (!all_digits(index)) {
      in_gpu = false;
      continue;
    }
    Gpu g;
    g.index = std::stoi(index);
    std::string rest = trim(line.substr(colon + 1));
    // The last "(" opening "UUID:" (a name may hold parentheses of its own).
    for (size_t open = rest.rfind('('); open != std::string::npos;
         open = open ? rest.rfind('(', open - 1) : std::string::npos) {
      std::string inside = trim(rest.substr(open + 1));
      if (inside.compare(0, 4, "UUID") != 0) continue;
      inside = trim(inside.substr(4));
      if (inside.empty() || inside[0] != ':') continue;
      size_t close = inside.rfind(')');
      g.uuid = trim(inside.substr(1, close == std::string::npos ? std::string::npos : close - 1));
      rest = trim(rest.substr(0, open));
      break;
    }
    g.name = rest;
    g.memory_mib = 0;
    g.mig = -1;
    gpus.push_back(std::move(g));
    in_gpu = true;
  }
  return gpus;
}

std::vector<int> visible_gpus(const GpuInventory& inventory,
                              const std::optional<std::string>& cuda_visible_devices) {
  std::vector<int> out;
  if (!cuda_visible_devices) {
    for (const auto& g : inventory.gpus) out.push_back(g.index);
    return out;
  }
  const std::string& list = *cuda_visible_devices;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    std::string entry =
        trim(list.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    start = comma == std::string::npos ? list.size() + 1 : comma + 1;
    int found = -1;
    if (all_digits(entry)) {
      int want = std::stoi(entry);
      for (const auto& g : inventory.gpus)
        if (g.index == want) found = want;
    } else if (lower(entry).compare(0, 4, "gpu-") == 0) {
      int matches = 0;
      for (const auto& g : inventory.gpus)
        if (lower(g.uuid).compare(0, entry.size(), lower(entry)) == 0) {
          found = g.index;
          ++matches;
        }
      if (matches != 1) found = -1;  // unknown, or a prefix of several
    }
    bool repeated = false;
    for (int i : out) repeated = repeated || i == found;
    if (found < 0 || repeated) break;  // CUDA ignores this entry and every one after it
    out.push_back(found);
  }
  return out;
}

GpuInventory probe_gpus(const std::string& nvml_library, const std::string& path) {
  GpuInventory inv;
  std::vector<std::string> why;
  bool no_driver = true;  // every way failed for want of the driver itself
  if (probe_nvml(nvml_library, inv, why, no_driver)) return inv;
  if (probe_nvidia_smi(path, inv, why, no_driver)) {
    inv.note = join(why, ", ");  // why NVML was not used
    return inv;
  }
  inv.source.clear();
  inv.note = std::string(no_driver ? "no NVIDIA driver: " : "no GPU found: ") + join(why, ", ");
  return inv;
}

}  // namespace mltrain::agent
