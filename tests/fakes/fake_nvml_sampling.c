/* The sampling calls of the fake libnvidia-ml.so.1 (part of target fake_nvml, beside fake_nvml.c):
 * what runner/telemetry's GpuSampler asks each interval, answered from fake-gpus.conf beside the
 * library (tests/fakes/README.md, "Sampling"). Keys, per host or "*"; a key "K.<i>" (e.g. "util.1")
 * overrides "K" for GPU i:
 *   util N, mem_util N      utilization.gpu / .memory in % (default 0); on a MIG GPU
 *                           ("mig 1" or "mig.<i> 1") nvmlDeviceGetUtilizationRates is NOT_SUPPORTED
 *   mem_used_mib N          nvmlDeviceGetMemoryInfo_v2's used (default 0); total is memory_mib
 *   mem_reserved_mib N      its reserved (default 0)
 *   power_w W               nvmlDeviceGetPowerUsage, W with decimals (default 100)
 *   power_limit_w W         nvmlDeviceGetEnforcedPowerLimit (default 700)
 *   temp_c N                nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU) (default 40)
 *   sm_clock_mhz N          nvmlDeviceGetClockInfo(NVML_CLOCK_SM / _GRAPHICS) (default 1980)
 *   throttle MASK           nvmlDeviceGetCurrentClocks{Event,Throttle}Reasons, 0x4 or 4 (default 0)
 *   event_reasons 0         nvmlDeviceGetCurrentClocksEventReasons answers FUNCTION_NOT_FOUND
 *                           (a driver older than R535), the Throttle name still works
 *   pids.<i> PID:MIB,...    the compute processes on GPU i; MIB "-" is NVML_VALUE_NOT_AVAILABLE
 *   lost 1                  every sampling call answers NVML_ERROR_GPU_IS_LOST
 * The value "none" makes that call answer NVML_ERROR_NOT_SUPPORTED. Handles are fake_nvml.c's
 * (struct nvmlDevice_st, one per GPU); a handle is checked through nvmlDeviceGetHandleByIndex_v2,
 * so calls before nvmlInit answer NVML_ERROR_UNINITIALIZED as in fake_nvml.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_conf.h"

typedef int nvmlReturn_t;
typedef struct nvmlDevice_st* nvmlDevice_t;
struct nvmlDevice_st {
  unsigned index; /* as in fake_nvml.c */
};
typedef struct {
  unsigned int gpu, memory;
} nvmlUtilization_t;
typedef struct {
  unsigned int version;
  unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;
typedef struct {
  unsigned int pid;
  unsigned long long usedGpuMemory;
  unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_v2_t; /* also nvmlProcessInfo_t, what _v2 and _v3 fill */

enum {
  NVML_SUCCESS = 0,
  NVML_ERROR_UNINITIALIZED = 1,
  NVML_ERROR_INVALID_ARGUMENT = 2,
  NVML_ERROR_NOT_SUPPORTED = 3,
  NVML_ERROR_INSUFFICIENT_SIZE = 7,
  NVML_ERROR_FUNCTION_NOT_FOUND = 13,
  NVML_ERROR_GPU_IS_LOST = 15,
  NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};
#define NVML_VALUE_NOT_AVAILABLE (~0ULL)
/* NVML_STRUCT_VERSION(Memory, 2) */
#define NVML_MEMORY_V2 ((unsigned)(sizeof(nvmlMemory_v2_t) | (2u << 24)))
#define MAX_PROCS 256

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, nvmlDevice_t* device); /* fake_nvml.c */

static const char self_marker = 0; /* any address in this library, for fake_conf_get */

/* The value of `key` for GPU i: "key.i" first, then "key"; NULL when neither is set. */
static const char* gpu_conf(unsigned i, const char* key) {
  char name[96];
  snprintf(name, sizeof name, "%s.%u", key, i);
  const char* v = fake_conf_get(&self_marker, name);
  if (v != NULL && *v != 0) return v;
  v = fake_conf_get(&self_marker, key);
  return v != NULL && *v != 0 ? v : NULL;
}

static int is_none(const char* v) { return v != NULL && strcmp(v, "none") == 0; }

static unsigned long long gpu_ull(unsigned i, const char* key, unsigned long long fallback) {
  const char* v = gpu_conf(i, key);
  if (v == NULL) return fallback;
  char* end = NULL;
  unsigned long long n = strtoull(v, &end, 0);
  return end != v && *end == 0 ? n : fallback;
}

/* Watts with decimals ("245.5") as milliwatts. */
static unsigned gpu_mw(unsigned i, const char* key, double fallback_w) {
  const char* v = gpu_conf(i, key);
  double w = fallback_w;
  if (v != NULL) {
    char* end = NULL;
    double n = strtod(v, &end);
    if (end != v && *end == 0 && n >= 0) w = n;
  }
  return (unsigned)(w * 1000.0 + 0.5);
}

/* NVML_SUCCESS for a handle fake_nvml.c gave out since nvmlInit, else its error. */
static nvmlReturn_t check(nvmlDevice_t d) {
  if (d == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  nvmlDevice_t same = NULL;
  nvmlReturn_t r = nvmlDeviceGetHandleByIndex_v2(d->index, &same);
  if (r != NVML_SUCCESS) return r;
  if (same != d) return NVML_ERROR_INVALID_ARGUMENT;
  if (gpu_ull(d->index, "lost", 0)) return NVML_ERROR_GPU_IS_LOST;
  return NVML_SUCCESS;
}

static int gpu_mig(unsigned i) { return gpu_ull(i, "mig", 0) != 0; }

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t* out) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (gpu_mig(d->index) || is_none(gpu_conf(d->index, "util"))) return NVML_ERROR_NOT_SUPPORTED;
  out->gpu = (unsigned)gpu_ull(d->index, "util", 0);
  out->memory = (unsigned)gpu_ull(d->index, "mem_util", 0);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t* out) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (out->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
  unsigned long long total = gpu_ull(d->index, "memory_mib", 81559) << 20;
  unsigned long long used = gpu_ull(d->index, "mem_used_mib", 0) << 20;
  unsigned long long reserved = gpu_ull(d->index, "mem_reserved_mib", 0) << 20;
  if (used + reserved > total) used = total - (reserved > total ? total : reserved);
  out->total = total;
  out->used = used;
  out->reserved = reserved;
  out->free = total - used - reserved;
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned* mw) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (mw == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (is_none(gpu_conf(d->index, "power_w"))) return NVML_ERROR_NOT_SUPPORTED;
  *mw = gpu_mw(d->index, "power_w", 100);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned* mw) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (mw == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (is_none(gpu_conf(d->index, "power_limit_w"))) return NVML_ERROR_NOT_SUPPORTED;
  *mw = gpu_mw(d->index, "power_limit_w", 700);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned* celsius) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (celsius == NULL || sensor != 0 /* NVML_TEMPERATURE_GPU */) return NVML_ERROR_INVALID_ARGUMENT;
  if (is_none(gpu_conf(d->index, "temp_c"))) return NVML_ERROR_NOT_SUPPORTED;
  *celsius = (unsigned)gpu_ull(d->index, "temp_c", 40);
  return NVML_SUCCESS;
}

/* nvmlClockType_t: GRAPHICS 0, SM 1, MEM 2, VIDEO 3. */
nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned* mhz) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (mhz == NULL || type < 0 || type > 3) return NVML_ERROR_INVALID_ARGUMENT;
  if (type <= 1) {
    if (is_none(gpu_conf(d->index, "sm_clock_mhz"))) return NVML_ERROR_NOT_SUPPORTED;
    *mhz = (unsigned)gpu_ull(d->index, "sm_clock_mhz", 1980);
  } else {
    *mhz = type == 2 ? 2619u : 1755u;
  }
  return NVML_SUCCESS;
}

static nvmlReturn_t reasons(nvmlDevice_t d, unsigned long long* mask) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (mask == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  if (is_none(gpu_conf(d->index, "throttle"))) return NVML_ERROR_NOT_SUPPORTED;
  *mask = gpu_ull(d->index, "throttle", 0);
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long* mask) {
  if (fake_conf_int(&self_marker, "event_reasons", 1) == 0) return NVML_ERROR_FUNCTION_NOT_FOUND;
  return reasons(d, mask);
}

nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long* mask) {
  return reasons(d, mask);
}

/* The processes of pids.<i>: fills pid[] and mib[] (-1: unknown), returns how many. */
static unsigned gpu_procs(unsigned i, unsigned pid[MAX_PROCS], long long mib[MAX_PROCS]) {
  char key[32];
  snprintf(key, sizeof key, "pids.%u", i);
  const char* v = fake_conf_get(&self_marker, key);
  unsigned n = 0;
  while (v != NULL && *v != 0 && n < MAX_PROCS) {
    char* end = NULL;
    unsigned long p = strtoul(v, &end, 10);
    if (end == v || *end != ':') break;
    v = end + 1;
    if (*v == '-') {
      mib[n] = -1;
      ++v;
    } else {
      mib[n] = strtoll(v, &end, 10);
      if (end == v) break;
      v = end;
    }
    pid[n++] = (unsigned)p;
    if (*v == ',') ++v;
  }
  return n;
}

/* The semantics NVML documents: *count too small (0 to ask) -> INSUFFICIENT_SIZE with the count
 * needed (SUCCESS when none run); `infos` may be NULL then. */
static nvmlReturn_t procs(nvmlDevice_t d, unsigned* count, void* infos, size_t size) {
  nvmlReturn_t r = check(d);
  if (r != NVML_SUCCESS) return r;
  if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned pid[MAX_PROCS];
  long long mib[MAX_PROCS];
  unsigned n = gpu_procs(d->index, pid, mib);
  if (*count < n) {
    *count = n;
    return NVML_ERROR_INSUFFICIENT_SIZE;
  }
  *count = n;
  if (n > 0 && infos == NULL) return NVML_ERROR_INVALID_ARGUMENT;
  unsigned instance = gpu_mig(d->index) ? 0u : 0xFFFFFFFFu;
  for (unsigned k = 0; k < n; ++k) {
    unsigned long long used = mib[k] < 0 ? NVML_VALUE_NOT_AVAILABLE : (unsigned long long)mib[k] << 20;
    if (size == sizeof(nvmlProcessInfo_v1_t)) {
      nvmlProcessInfo_v1_t* p = (nvmlProcessInfo_v1_t*)infos + k;
      p->pid = pid[k];
      p->usedGpuMemory = used;
    } else {
      nvmlProcessInfo_v2_t* p = (nvmlProcessInfo_v2_t*)infos + k;
      p->pid = pid[k];
      p->usedGpuMemory = used;
      p->gpuInstanceId = instance;
      p->computeInstanceId = instance;
    }
  }
  return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned* count,
                                                     nvmlProcessInfo_v2_t* infos) {
  return procs(d, count, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned* count,
                                                     nvmlProcessInfo_v2_t* infos) {
  return procs(d, count, infos, sizeof *infos);
}

nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t d, unsigned* count,
                                                  nvmlProcessInfo_v1_t* infos) {
  return procs(d, count, infos, sizeof *infos);
}
