// runner/gpu: the one NVML binding (against the fake libnvidia-ml.so.1) and the tool runner.
#include <dlfcn.h>
#include <doctest/doctest.h>
#include <errno.h>
#include <sys/wait.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "runner/gpu/nvml.h"
#include "runner/gpu/run_tool.h"
#include "temp_dir.h"

namespace fs = std::filesystem;
using mltrain::gpu::Nvml;

namespace {

// A copy of the fake libnvidia-ml.so.1 beside its own fake-gpus.conf.
struct FakeNvml {
  mltrain::testing::TempDir dir{"gpu"};
  explicit FakeNvml(const std::string& conf) {
    dir.write("fake-gpus.conf", conf);
    fs::copy_file(fs::path(MLTRAIN_FAKES_DIR) / "libnvidia-ml.so.1", dir.path / "libnvidia-ml.so.1");
    // The fakes' conf reader leaks its strings on purpose (fake_conf.c): kept loaded, the copy
    // stays known to LeakSanitizer, which __lsan_default_suppressions tells to skip it.
    if (void* lib = dlopen(path().c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) dlclose(lib);
  }
  std::string path() const { return (dir.path / "libnvidia-ml.so.1").string(); }
};

}  // namespace

TEST_CASE("gpu: NVML through the one binding, every call a return code") {
  FakeNvml fake(
      "* gpus 2\n* util 87\n* mig.1 1\n* mem_used_mib 1234\n* temp_c 65\n* pids.0 1234:5678,99:-\n");
  Nvml::Failure failed;
  auto nvml = Nvml::open(fake.path(), failed);
  REQUIRE(nvml);
  CHECK(nvml->found_text() == fs::canonical(fake.path()).string() + " (MLTRAIN_NVML_LIBRARY)");
  unsigned count = 0;
  REQUIRE(nvml->device_count(count) == Nvml::kSuccess);
  REQUIRE(count == 2);
  Nvml::Device dev = nullptr;
  REQUIRE(nvml->device(0, dev) == Nvml::kSuccess);
  std::string uuid;
  CHECK(nvml->uuid(dev, uuid) == Nvml::kSuccess);
  CHECK(uuid.rfind("GPU-", 0) == 0);
  unsigned util = 0, temp = 0;
  CHECK(nvml->utilization(dev, util) == Nvml::kSuccess);
  CHECK(util == 87);
  CHECK(nvml->temperature_c(dev, temp) == Nvml::kSuccess);
  CHECK(temp == 65);
  Nvml::Memory mem;
  CHECK(nvml->memory(dev, mem) == Nvml::kSuccess);
  CHECK((mem.used >> 20) == 1234);
  std::vector<Nvml::Process> procs;
  CHECK(nvml->compute_processes(dev, procs) == Nvml::kSuccess);
  REQUIRE(procs.size() == 2);
  CHECK(procs[0].pid == 1234);
  CHECK((procs[0].used_bytes >> 20) == 5678);
  CHECK(procs[1].used_bytes == Nvml::kValueNotAvailable);
  // A MIG-enabled GPU's utilization is not supported: a code, not an exception.
  REQUIRE(nvml->device(1, dev) == Nvml::kSuccess);
  CHECK(nvml->utilization(dev, util) == Nvml::kNotSupported);
  CHECK(nvml->what(Nvml::kNotSupported).find("Not Supported") != std::string::npos);
}

TEST_CASE("gpu: why NVML did not open") {
  mltrain::testing::TempDir d("gpu");
  Nvml::Failure failed;
  CHECK_FALSE(Nvml::open(d.str() + "/libnvidia-ml.so.1", failed));
  CHECK(failed.step == Nvml::Failure::Step::load);
  CHECK(failed.named);
  CHECK(failed.file == d.str() + "/libnvidia-ml.so.1");
  CHECK(failed.error.find("No such file or directory") != std::string::npos);
  // A library without NVML's calls.
  CHECK_FALSE(Nvml::open("libc.so.6", failed));
  CHECK(failed.step == Nvml::Failure::Step::symbols);
  CHECK(failed.missing == "nvmlInit_v2");
}

TEST_CASE("gpu: a tool's output, exit, timeout and absence") {
  std::string out;
  const char* talk[] = {"/bin/sh", "-c", "echo out; echo err >&2; exit 3", nullptr};
  int status = mltrain::gpu::run_tool(talk, 60000, 1 << 16, out);
  CHECK(mltrain::gpu::tool_exit_code(status) == 3);
  CHECK(out == "out\nerr\n");

  const char* flood[] = {"/bin/sh", "-c", "head -c 100000 /dev/zero", nullptr};
  status = mltrain::gpu::run_tool(flood, 60000, 1000, out);
  CHECK(mltrain::gpu::tool_exit_code(status) == 0);
  CHECK(out.size() >= 1000);
  CHECK(out.size() < 1000 + 4096 + 1);  // kept up to the bound (one read past it at most)

  const auto t0 = std::chrono::steady_clock::now();
  const char* hang[] = {"/bin/sh", "-c", "exec sleep 30", nullptr};
  CHECK(mltrain::gpu::run_tool(hang, 100, 1 << 16, out) == mltrain::gpu::kToolTimedOut);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));

  const char* missing[] = {"/nonexistent/nvidia-smi", "-L", nullptr};
  CHECK(mltrain::gpu::run_tool(missing, 1000, 1 << 16, out) == mltrain::gpu::kToolNotStarted);
  CHECK(errno == ENOENT);
  CHECK(mltrain::gpu::tool_exit_code(mltrain::gpu::kToolTimedOut) == mltrain::gpu::kToolTimedOut);
}
