/* Fake libcudart.so.13 for GPU-less CI (tests/fakes/README.md). Devices come from fake-gpus.conf
 * ("gpus N"), restricted by CUDA_VISIBLE_DEVICES as CUDA does; device memory is host memory kept in
 * a registry; each stream is a queue worked by its own thread, and the legacy default stream
 * synchronises with blocking streams as on a GPU. Only the real API names are exported. */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <cuda_runtime_api.h>
#pragma GCC visibility pop

#include <ctype.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_conf.h"

enum { MAX_GPUS = 64, FAKE_CUDA_VERSION = 13000 };

/* ---- errors ---- */

static __thread cudaError_t t_last_error = cudaSuccess;

static cudaError_t fail(cudaError_t e) {
  t_last_error = e;
  return e;
}

static const struct {
  cudaError_t code;
  const char* name;
  const char* text;
} k_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorCudartUnloading, "cudaErrorCudartUnloading", "driver shutting down"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidMemcpyDirection, "cudaErrorInvalidMemcpyDirection", "invalid copy direction for memcpy"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorDevicesUnavailable, "cudaErrorDevicesUnavailable",
     "CUDA-capable device(s) is/are busy or unavailable"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress", "an illegal memory access was encountered"},
    {cudaErrorNotSupported, "cudaErrorNotSupported", "operation not supported"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

const char* cudaGetErrorName(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; ++i)
    if (k_errors[i].code == error) return k_errors[i].name;
  return "unrecognized error code";
}

const char* cudaGetErrorString(cudaError_t error) {
  for (size_t i = 0; i < sizeof k_errors / sizeof k_errors[0]; ++i)
    if (k_errors[i].code == error) return k_errors[i].text;
  return "unrecognized error code";
}

cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last_error; }

cudaError_t cudaRuntimeGetVersion(int* version) {
  if (version == NULL) return fail(cudaErrorInvalidValue);
  *version = FAKE_CUDA_VERSION;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* version) {
  if (version == NULL) return fail(cudaErrorInvalidValue);
  *version = FAKE_CUDA_VERSION;
  return cudaSuccess;
}

/* ---- devices ---- */

/* Visible device d is physical GPU g_phys[d]; read once, as CUDA reads its environment once. */
static int g_ndev;
static int g_phys[MAX_GPUS];
static pthread_once_t g_devices_once = PTHREAD_ONCE_INIT;
static __thread int t_device = 0;

/* One CUDA_VISIBLE_DEVICES entry: a physical index or a (prefix of a) UUID; -1 if invalid. */
static int parse_visible_entry(const char* entry, int physical) {
  if (strncmp(entry, "GPU-", 4) == 0) {
    int found = -1;
    for (int g = 0; g < physical; ++g) {
      char uuid[64];
      fake_gpu_uuid(g, uuid, sizeof uuid);
      if (strncmp(uuid, entry, strlen(entry)) != 0) continue;
      if (found >= 0) return -1; /* ambiguous prefix */
      found = g;
    }
    return found;
  }
  if (!isdigit((unsigned char)entry[0])) return -1;
  char* end = NULL;
  long g = strtol(entry, &end, 10);
  while (end && isspace((unsigned char)*end)) ++end;
  if (end == NULL || *end != 0 || g >= physical) return -1;
  return (int)g;
}

static void devices_init(void) {
  long physical = fake_conf_int((const void*)&cudaGetDeviceCount, "gpus", 0);
  if (physical < 0) physical = 0;
  if (physical > MAX_GPUS) physical = MAX_GPUS;
  const char* visible = getenv("CUDA_VISIBLE_DEVICES");
  if (visible == NULL) {
    for (int g = 0; g < physical; ++g) g_phys[g] = g;
    g_ndev = (int)physical;
    return;
  }
  char* list = strdup(visible);
  if (list == NULL) return;
  char* save = NULL;
  /* Like CUDA, the list ends at its first invalid (or repeated) entry. */
  for (char* e = strtok_r(list, ",", &save); e != NULL && g_ndev < MAX_GPUS; e = strtok_r(NULL, ",", &save)) {
    while (isspace((unsigned char)*e)) ++e;
    int g = parse_visible_entry(e, (int)physical);
    if (g < 0) break;
    int repeated = 0;
    for (int d = 0; d < g_ndev; ++d) repeated |= g_phys[d] == g;
    if (repeated) break;
    g_phys[g_ndev++] = g;
  }
  free(list);
}

static int device_count(void) {
  pthread_once(&g_devices_once, devices_init);
  return g_ndev;
}

/* cudaSuccess if this process has a device (most calls need one, as CUDA's context does). */
static cudaError_t need_device(void) { return device_count() > 0 ? cudaSuccess : cudaErrorNoDevice; }

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == NULL) return fail(cudaErrorInvalidValue);
  *count = device_count();
  return *count > 0 ? cudaSuccess : fail(cudaErrorNoDevice);
}

cudaError_t cudaSetDevice(int device) {
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == NULL) return fail(cudaErrorInvalidValue);
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetPCIBusId(char* pciBusId, int len, int device) {
  if (pciBusId == NULL || len <= 0) return fail(cudaErrorInvalidValue);
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  snprintf(pciBusId, (size_t)len, "00000000:%02X:00.0", 0x18 + g_phys[device]);
  return cudaSuccess;
}

/* ---- streams ----
 * Every stream has a FIFO of items and a worker thread. g_lock guards all streams; g_progress is
 * broadcast whenever any item completes. An item may first wait for other streams to reach a
 * count (the legacy default stream's implicit synchronisation), always for work enqueued before it,
 * so the waits cannot form a cycle. */

enum ItemKind { ITEM_HOST_FN, ITEM_COPY, ITEM_SET, ITEM_MARK };

struct Dep {
  struct CUstream_st* stream;
  uint64_t target;
};

struct Item {
  struct Item* next;
  enum ItemKind kind;
  cudaHostFn_t fn;
  void* data;
  void* dst;
  const void* src;
  size_t bytes;
  int value;
  int ndeps;
  struct Dep* deps;
};

struct CUstream_st {
  struct CUstream_st* next; /* g_streams: every stream not yet freed */
  int device;
  unsigned flags;
  int legacy;
  int destroyed;
  int refs; /* the handle, the worker, and each Dep naming it */
  pthread_cond_t wake;
  struct Item* head;
  struct Item* tail;
  uint64_t enqueued;
  uint64_t completed;
};

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_progress = PTHREAD_COND_INITIALIZER;
static struct CUstream_st* g_streams;
static struct CUstream_st* g_legacy;

/* g_lock held. */
static void stream_unref(struct CUstream_st* s) {
  if (--s->refs > 0) return;
  for (struct CUstream_st** p = &g_streams; *p; p = &(*p)->next)
    if (*p == s) {
      *p = s->next;
      break;
    }
  pthread_cond_destroy(&s->wake);
  free(s);
}

static void run_item(struct Item* it) {
  switch (it->kind) {
    case ITEM_HOST_FN:
      it->fn(it->data);
      break;
    case ITEM_COPY:
      memmove(it->dst, it->src, it->bytes);
      break;
    case ITEM_SET:
      memset(it->dst, it->value, it->bytes);
      break;
    case ITEM_MARK:
      break;
  }
}

static void* stream_main(void* arg) {
  struct CUstream_st* s = arg;
  pthread_mutex_lock(&g_lock);
  for (;;) {
    while (s->head == NULL && !s->destroyed) pthread_cond_wait(&s->wake, &g_lock);
    struct Item* it = s->head;
    if (it == NULL) break;
    for (int i = 0; i < it->ndeps; ++i) {
      while (it->deps[i].stream->completed < it->deps[i].target) pthread_cond_wait(&g_progress, &g_lock);
      stream_unref(it->deps[i].stream);
    }
    it->ndeps = 0;
    pthread_mutex_unlock(&g_lock);
    run_item(it);
    pthread_mutex_lock(&g_lock);
    s->head = it->next;
    if (s->head == NULL) s->tail = NULL;
    s->completed++;
    pthread_cond_broadcast(&g_progress);
    free(it->deps);
    free(it);
  }
  stream_unref(s);
  pthread_mutex_unlock(&g_lock);
  return NULL;
}

/* g_lock held. */
static cudaError_t stream_new(int device, unsigned flags, int legacy, struct CUstream_st** out) {
  struct CUstream_st* s = calloc(1, sizeof *s);
  if (s == NULL) return cudaErrorMemoryAllocation;
  s->device = device;
  s->flags = flags;
  s->legacy = legacy;
  s->refs = 2;
  pthread_cond_init(&s->wake, NULL);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, stream_main, s);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    pthread_cond_destroy(&s->wake);
    free(s);
    return cudaErrorMemoryAllocation;
  }
  s->next = g_streams;
  g_streams = s;
  *out = s;
  return cudaSuccess;
}

/* The stream a handle names, or NULL for a bad handle; stream 0, cudaStreamLegacy and
 * cudaStreamPerThread are the one default stream. g_lock held. */
static struct CUstream_st* stream_resolve(cudaStream_t handle) {
  if (handle == NULL || handle == cudaStreamLegacy || handle == cudaStreamPerThread) {
    if (g_legacy == NULL && stream_new(0, cudaStreamDefault, 1, &g_legacy) != cudaSuccess) return NULL;
    return g_legacy;
  }
  for (struct CUstream_st* s = g_streams; s; s = s->next)
    if (s == handle) return s->destroyed ? NULL : s;
  return NULL;
}

static int dep_add(struct Item* it, struct CUstream_st* s) {
  if (s->completed >= s->enqueued) return 1;
  struct Dep* deps = realloc(it->deps, (size_t)(it->ndeps + 1) * sizeof *deps);
  if (deps == NULL) return 0;
  it->deps = deps;
  deps[it->ndeps].stream = s;
  deps[it->ndeps].target = s->enqueued;
  it->ndeps++;
  s->refs++;
  return 1;
}

/* Appends `it` to `s` (g_lock held) and returns its position, for waiting on it. */
static uint64_t stream_push(struct CUstream_st* s, struct Item* it) {
  /* Legacy default stream semantics: its work waits for earlier work of every blocking stream,
   * and a blocking stream's work waits for earlier work of the legacy stream. */
  if (s->legacy) {
    for (struct CUstream_st* t = g_streams; t; t = t->next)
      if (t != s && !t->legacy && !(t->flags & cudaStreamNonBlocking)) dep_add(it, t);
  } else if (!(s->flags & cudaStreamNonBlocking) && g_legacy != NULL) {
    dep_add(it, g_legacy);
  }
  it->next = NULL;
  if (s->tail)
    s->tail->next = it;
  else
    s->head = it;
  s->tail = it;
  pthread_cond_signal(&s->wake);
  return ++s->enqueued;
}

/* g_lock held. */
static void stream_wait(struct CUstream_st* s, uint64_t target) {
  s->refs++;
  while (s->completed < target) pthread_cond_wait(&g_progress, &g_lock);
  stream_unref(s);
}

static cudaError_t enqueue(cudaStream_t handle, struct Item* it, int wait) {
  pthread_mutex_lock(&g_lock);
  struct CUstream_st* s = stream_resolve(handle);
  if (s == NULL) {
    pthread_mutex_unlock(&g_lock);
    free(it);
    return fail(cudaErrorInvalidResourceHandle);
  }
  uint64_t pos = stream_push(s, it);
  if (wait) stream_wait(s, pos);
  pthread_mutex_unlock(&g_lock);
  return cudaSuccess;
}

static struct Item* item_new(enum ItemKind kind) {
  struct Item* it = calloc(1, sizeof *it);
  if (it) it->kind = kind;
  return it;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  if (stream == NULL || (flags & ~(unsigned)cudaStreamNonBlocking) != 0) return fail(cudaErrorInvalidValue);
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&g_lock);
  struct CUstream_st* s = NULL;
  cudaError_t e = stream_new(t_device, flags, 0, &s);
  pthread_mutex_unlock(&g_lock);
  if (e != cudaSuccess) return fail(e);
  *stream = s;
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) {
  return cudaStreamCreateWithFlags(stream, cudaStreamDefault);
}

/* Like CUDA, returns at once; queued work still runs, then the stream goes away. */
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  pthread_mutex_lock(&g_lock);
  struct CUstream_st* s = stream_resolve(stream);
  if (s == NULL || s->legacy) {
    pthread_mutex_unlock(&g_lock);
    return fail(cudaErrorInvalidResourceHandle);
  }
  s->destroyed = 1;
  pthread_cond_signal(&s->wake);
  stream_unref(s);
  pthread_mutex_unlock(&g_lock);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  pthread_mutex_lock(&g_lock);
  struct CUstream_st* s = stream_resolve(stream);
  cudaError_t e = s == NULL                    ? cudaErrorInvalidResourceHandle
                  : s->completed < s->enqueued ? cudaErrorNotReady
                                               : cudaSuccess;
  pthread_mutex_unlock(&g_lock);
  /* "Not ready" is an answer, not an error: it is not recorded as the last error. */
  return e == cudaErrorInvalidResourceHandle ? fail(e) : e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  pthread_mutex_lock(&g_lock);
  struct CUstream_st* s = stream_resolve(stream);
  if (s == NULL) {
    pthread_mutex_unlock(&g_lock);
    return fail(cudaErrorInvalidResourceHandle);
  }
  if (s->legacy) {
    /* The legacy stream is a barrier: wait as for an empty item enqueued on it. */
    struct Item* mark = item_new(ITEM_MARK);
    if (mark == NULL) {
      pthread_mutex_unlock(&g_lock);
      return fail(cudaErrorMemoryAllocation);
    }
    stream_wait(s, stream_push(s, mark));
  } else {
    stream_wait(s, s->enqueued);
  }
  pthread_mutex_unlock(&g_lock);
  return cudaSuccess;
}

/* Waits for the work enqueued so far on `device`'s streams and the default stream. g_lock held. */
static void device_wait(int device) {
  struct CUstream_st* s = g_streams;
  if (s) s->refs++;
  while (s) {
    if (s->legacy || s->device == device) stream_wait(s, s->enqueued);
    struct CUstream_st* next = s->next;
    if (next) next->refs++;
    stream_unref(s);
    s = next;
  }
}

cudaError_t cudaDeviceSynchronize(void) {
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  pthread_mutex_lock(&g_lock);
  device_wait(t_device);
  pthread_mutex_unlock(&g_lock);
  return cudaSuccess;
}

cudaError_t cudaLaunchHostFunc(cudaStream_t stream, cudaHostFn_t fn, void* userData) {
  if (fn == NULL) return fail(cudaErrorInvalidValue);
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  struct Item* it = item_new(ITEM_HOST_FN);
  if (it == NULL) return fail(cudaErrorMemoryAllocation);
  it->fn = fn;
  it->data = userData;
  return enqueue(stream, it, 0);
}

/* ---- memory ----
 * Device memory is 256-byte aligned host memory; the registry answers cudaPointerGetAttributes. */

struct Alloc {
  char* base;
  size_t size;
  int device;
};

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static struct Alloc* g_allocs;
static size_t g_nallocs;
static size_t g_cap;

cudaError_t cudaMalloc(void** devPtr, size_t size) {
  if (devPtr == NULL) return fail(cudaErrorInvalidValue);
  *devPtr = NULL;
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  if (size == 0) return cudaSuccess;
  void* p = NULL;
  if (posix_memalign(&p, 256, size) != 0) return fail(cudaErrorMemoryAllocation);
  pthread_mutex_lock(&g_mem_lock);
  if (g_nallocs == g_cap) {
    size_t cap = g_cap ? 2 * g_cap : 64;
    struct Alloc* grown = realloc(g_allocs, cap * sizeof *grown);
    if (grown == NULL) {
      pthread_mutex_unlock(&g_mem_lock);
      free(p);
      return fail(cudaErrorMemoryAllocation);
    }
    g_allocs = grown;
    g_cap = cap;
  }
  g_allocs[g_nallocs++] = (struct Alloc){p, size, t_device};
  pthread_mutex_unlock(&g_mem_lock);
  *devPtr = p;
  return cudaSuccess;
}

cudaError_t cudaFree(void* devPtr) {
  if (devPtr == NULL) return cudaSuccess;
  pthread_mutex_lock(&g_mem_lock);
  size_t i = 0;
  while (i < g_nallocs && g_allocs[i].base != devPtr) ++i;
  int found = i < g_nallocs;
  int device = found ? g_allocs[i].device : 0;
  pthread_mutex_unlock(&g_mem_lock);
  if (!found) return fail(cudaErrorInvalidValue);
  /* cudaFree synchronises the device: queued work may still use the memory. */
  pthread_mutex_lock(&g_lock);
  device_wait(device);
  pthread_mutex_unlock(&g_lock);
  pthread_mutex_lock(&g_mem_lock);
  for (i = 0; i < g_nallocs; ++i)
    if (g_allocs[i].base == devPtr) {
      g_allocs[i] = g_allocs[--g_nallocs];
      found = 2;
      break;
    }
  pthread_mutex_unlock(&g_mem_lock);
  if (found != 2) return fail(cudaErrorInvalidValue); /* freed twice, concurrently */
  free(devPtr);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(struct cudaPointerAttributes* attributes, const void* ptr) {
  if (attributes == NULL) return fail(cudaErrorInvalidValue);
  memset(attributes, 0, sizeof *attributes);
  const char* p = ptr;
  pthread_mutex_lock(&g_mem_lock);
  for (size_t i = 0; i < g_nallocs; ++i)
    if (p >= g_allocs[i].base && p < g_allocs[i].base + g_allocs[i].size) {
      attributes->type = cudaMemoryTypeDevice;
      attributes->device = g_allocs[i].device;
      attributes->devicePointer = (void*)ptr;
      pthread_mutex_unlock(&g_mem_lock);
      return cudaSuccess;
    }
  pthread_mutex_unlock(&g_mem_lock);
  /* CUDA >= 11: any other pointer is unregistered host memory, and that is not an error. */
  attributes->type = cudaMemoryTypeUnregistered;
  attributes->device = cudaInvalidDeviceId;
  attributes->hostPointer = (void*)ptr;
  return cudaSuccess;
}

static cudaError_t copy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                        cudaStream_t stream, int wait) {
  if ((unsigned)kind > (unsigned)cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection);
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  if (count == 0) return cudaSuccess;
  if (dst == NULL || src == NULL) return fail(cudaErrorInvalidValue);
  struct Item* it = item_new(ITEM_COPY);
  if (it == NULL) return fail(cudaErrorMemoryAllocation);
  it->dst = dst;
  it->src = src;
  it->bytes = count;
  return enqueue(stream, it, wait);
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind) {
  return copy(dst, src, count, kind, NULL, 1);
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t count, enum cudaMemcpyKind kind,
                            cudaStream_t stream) {
  return copy(dst, src, count, kind, stream, 0);
}

static cudaError_t set(void* dst, int value, size_t count, cudaStream_t stream, int wait) {
  if (need_device() != cudaSuccess) return fail(cudaErrorNoDevice);
  if (count == 0) return cudaSuccess;
  if (dst == NULL) return fail(cudaErrorInvalidValue);
  struct Item* it = item_new(ITEM_SET);
  if (it == NULL) return fail(cudaErrorMemoryAllocation);
  it->dst = dst;
  it->value = value;
  it->bytes = count;
  return enqueue(stream, it, wait);
}

cudaError_t cudaMemset(void* devPtr, int value, size_t count) { return set(devPtr, value, count, NULL, 1); }

cudaError_t cudaMemsetAsync(void* devPtr, int value, size_t count, cudaStream_t stream) {
  return set(devPtr, value, count, stream, 0);
}
