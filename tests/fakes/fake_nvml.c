/* libnvidia-ml.so.1 for tests: the few NVML calls mltrain's agent makes, answered from
 * fake-gpus.conf beside this library (tests/fakes/README.md, "NVML"). Keys, per host or "*":
 *   gpus N             GPUs on this host (0, the default: nvmlInit fails with "Driver Not Loaded")
 *   name TEXT          every GPU's name (default "NVIDIA H100 80GB HBM3")
 *   memory_mib N       every GPU's memory in MiB (default 81559)
 *   mig 0|1            MIG mode, current and pending (default 0)
 *   driver_version T   nvmlSystemGetDriverVersion (default "580.95.05")
 *   cuda_driver_version N  nvmlSystemGetCudaDriverVersion_v2 (default 13000: CUDA 13.0)
 *   init_delay_ms N    nvmlInit takes this long (default 0), as on a big or busy machine
 * UUIDs are fake_gpu_uuid(i), as the fake nvidia-smi and the fake CUDA runtime give them.
 * The ABI is NVML's (nvml.h): declared here, since no NVML header is needed to build it. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "fake_conf.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
typedef struct nvmlMemory_st {
  unsigned long long total, free, used;
} nvmlMemory_t;

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_DRIVER_NOT_LOADED = 9,
  NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64

struct nvmlDevice_st {
  unsigned index;
};

static struct nvmlDevice_st devices[MAX_GPUS];
static int init_count; /* nvmlInit and nvmlShutdown pair up, as in NVML */

static unsigned gpu_count(void) {
  long n = fake_conf_int(&init_count, "gpus", 0);
  return n < 0 ? 0u : n > MAX_GPUS ? (unsigned)MAX_GPUS : (unsigned)n;
}

static const char* conf_text(const char* key, const char* fallback) {
  const char* v = fake_conf_get(&init_count, key);
  return v != NULL && *v != 0 ? v : fallback;
}

static nvmlReturn_t copy_out(const char* text, char* out, unsigned length) {
  if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
  memcpy(out, text, strlen(text) + 1);
  return NVML_SUCCESS;
}

static int valid(nvmlDevice_t d) { return init_count > 0 && d >= devices && d < devices + gpu_count(); }

nvmlReturn_t nvmlInit_v2(void) {
  long delay_ms = fake_conf_int(&init_count, "init_delay_ms", 0);
  if (delay_ms > 0) {
    struct timespec ts = {delay_ms / 1000, (delay_ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
  }
  if (gpu_count() == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
  for (unsigned i = 0; i < MAX_GPUS; ++i) devices[i].index = i;
  ++init_count;
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlInit(void) { return nvmlInit_v2(); }

nvmlReturn_t nvmlShutdown(void) {
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  --init_count;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *count = gpu_count();
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetCount(unsigned* count) { return nvmlDeviceGetCount_v2(count); }

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device) {
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (device == NULL || index >= gpu_count()) return NVML_ERROR_INVALID_ARGUMENT;
  *device = &devices[index];
  return NVML_SUCCESS;
}
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, nvmlDevice_t* device) {
  return nvmlDeviceGetHandleByIndex_v2(index, device);
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char* name, unsigned length) {
  if (!valid(device)) return init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  return copy_out(conf_text("name", "NVIDIA H100 80GB HBM3"), name, length);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char* uuid, unsigned length) {
  if (!valid(device)) return init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  char text[96];
  fake_gpu_uuid((int)device->index, text, sizeof text);
  return copy_out(text, uuid, length);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t* memory) {
  if (!valid(device)) return init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  long mib = fake_conf_int(&init_count, "memory_mib", 81559);
  memory->total = (unsigned long long)(mib < 0 ? 0 : mib) << 20;
  memory->used = 0;
  memory->free = memory->total;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned* current, unsigned* pending) {
  if (!valid(device)) return init_count ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
  if (current == NULL || pending == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *current = *pending = fake_conf_int(&init_count, "mig", 0) ? 1u : 0u;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  if (version == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  *version = fake_conf_int(&init_count, "cuda_driver_version", 13000);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
  if (init_count == 0) return NVML_ERROR_UNINITIALIZED;
  return copy_out(conf_text("driver_version", "580.95.05"), version, length);
}

const char* nvmlErrorString(nvmlReturn_t result) {
  switch (result) {
    case NVML_SUCCESS:
      return "Success";
    case NVML_ERROR_UNINITIALIZED:
      return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
      return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
      return "Not Supported";
    case NVML_ERROR_INSUFFICIENT_SIZE:
      return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED:
      return "Driver Not Loaded";
    default:
      return "Unknown Error";
  }
}
