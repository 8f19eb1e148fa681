// The one search order for NCCL, the CUDA runtime and NVML (knobs/gpu_library.h).
#include "knobs/gpu_library.h"

#include <dlfcn.h>
#include <glob.h>
#include <limits.h>
#include <link.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <string_view>

namespace mltrain::knobs {
namespace {

std::vector<const char*> names_of(GpuLibrary lib) {
  switch (lib) {
    case GpuLibrary::nccl:
      return {"libnccl.so.2"};
    case GpuLibrary::cudart:
      return {"libcudart.so.13", "libcudart.so.12"};
    case GpuLibrary::nvml:
      return {"libnvidia-ml.so.1"};
  }
  return {};
}

std::string parent(const std::string& p) {
  auto slash = p.find_last_of('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : p.substr(0, slash);
}

bool is_file(const std::string& p) { return ::access(p.c_str(), F_OK) == 0; }

// python3 in this process's PATH, or "".
std::string python_in_path() {
  const char* path = std::getenv("PATH");
  std::string_view rest = path ? path : "";
  while (!rest.empty()) {
    auto colon = rest.find(':');
    std::string dir(rest.substr(0, colon));
    rest = colon == std::string_view::npos ? std::string_view() : rest.substr(colon + 1);
    if (dir.empty()) continue;
    std::string candidate = dir + "/python3";
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return {};
}

// The folders the interpreter's pip wheels put libraries in: <prefix>/lib/python3*/site-packages/
// nvidia/*/lib and its kin, for the prefix as named (a venv's bin/python3 is a link to the base
// interpreter: the venv is the name's prefix) and as resolved, and the user's ~/.local.
std::vector<std::string> wheel_patterns(const std::string& python) {
  std::vector<std::string> prefixes;
  if (python.find('/') != std::string::npos) {
    prefixes.push_back(parent(parent(python)));
    char real[PATH_MAX];
    if (::realpath(python.c_str(), real)) {
      std::string p = parent(parent(real));
      if (p != prefixes.front()) prefixes.push_back(p);
    }
  }
  if (const char* home = std::getenv("HOME"); home && *home)
    prefixes.push_back(std::string(home) + "/.local");
  std::vector<std::string> out;
  for (const auto& pre : prefixes)
    for (const char* sub : {"/lib/python3*/site-packages", "/lib/python3*/dist-packages",
                            "/local/lib/python3*/dist-packages", "/lib64/python3*/site-packages"})
      out.push_back(pre + sub + "/nvidia/*/lib/");
  return out;
}

std::string loaded_file(void* handle, const std::string& fallback) {
  struct link_map* map = nullptr;
  if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map && map->l_name && *map->l_name) {
    char real[PATH_MAX];
    return ::realpath(map->l_name, real) ? std::string(real) : std::string(map->l_name);
  }
  return fallback;
}

}  // namespace

const char* library_knob(GpuLibrary lib) {
  switch (lib) {
    case GpuLibrary::nccl:
      return "MLTRAIN_NCCL_LIBRARY";
    case GpuLibrary::cudart:
      return "MLTRAIN_CUDART_LIBRARY";
    case GpuLibrary::nvml:
      return "MLTRAIN_NVML_LIBRARY";
  }
  return "";
}

const char* library_default_name(GpuLibrary lib) { return names_of(lib).front(); }

std::string library_setting(GpuLibrary lib, const std::string& job_value) {
  if (!job_value.empty()) return job_value;
  const char* own = std::getenv(library_knob(lib));
  return own ? own : "";
}

std::vector<LibraryCandidate> library_candidates(GpuLibrary lib, const std::string& named,
                                                 const std::string& python) {
  if (!named.empty()) return {{named, library_knob(lib)}};
  const auto names = names_of(lib);
  std::vector<LibraryCandidate> out;
  for (const char* n : names) out.push_back({n, "loader path"});
  std::vector<std::pair<std::string, std::string>> dirs = {{"/usr/local/cuda/lib64/", "/usr/local/cuda"},
                                                           {"/usr/local/cuda/lib/", "/usr/local/cuda"}};
  // NVML is the driver's: where a container mounts the driver, not in CUDA (only its stub).
  if (lib == GpuLibrary::nvml)
    dirs = {{"/usr/local/nvidia/lib64/", "/usr/local/nvidia"},
            {"/usr/local/nvidia/lib/", "/usr/local/nvidia"}};
  for (const char* n : names)
    for (const auto& [dir, where] : dirs)
      if (is_file(dir + n)) out.push_back({dir + n, where});
  const std::string py = python.empty() ? python_in_path() : python;
  for (const char* n : names)
    for (const auto& pattern : wheel_patterns(py)) {
      glob_t g{};
      if (::glob((pattern + n).c_str(), 0, nullptr, &g) == 0)
        for (size_t i = 0; i < g.gl_pathc; ++i)
          out.push_back({g.gl_pathv[i], "python " + (py.empty() ? std::string("~/.local") : py)});
      ::globfree(&g);
    }
  return out;
}

std::string LoadedLibrary::found_text() const { return handle ? file + " (" + where + ")" : std::string(); }

LoadedLibrary load_library(GpuLibrary lib, const std::string& named, const std::string& python, int flags) {
  LoadedLibrary r;
  const auto candidates = library_candidates(lib, named, python);
  for (const auto& c : candidates) {
    if (void* h = ::dlopen(c.file.c_str(), flags ? flags : RTLD_NOW | RTLD_LOCAL)) {
      r.handle = h;
      r.file = loaded_file(h, c.file);
      r.where = c.where;
      r.error.clear();
      r.searched.clear();
      return r;
    }
    const char* e = ::dlerror();
    if (r.error.empty()) r.error = e ? e : c.file + ": cannot be loaded";
  }
  if (named.empty()) {
    const std::string py = python.empty() ? python_in_path() : python;
    r.searched = std::string("the loader path, ") +
                 (lib == GpuLibrary::nvml ? "/usr/local/nvidia/lib{64,}" : "/usr/local/cuda/lib{64,}") +
                 ", the nvidia/*/lib wheels of " + (py.empty() ? std::string("python3 (none in PATH)") : py);
  }
  return r;
}

}  // namespace mltrain::knobs
