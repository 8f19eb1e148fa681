/* Self-test of the fake libcudart.so.13 and libnccl.so.2 (ctest fake_gpu_libraries).
 *
 * The fakes read fake-gpus.conf beside themselves, so the test copies both into a temporary
 * folder, writes each scenario's conf there and dlopens the copies in forked rank processes
 * (rank 0 makes the unique id and hands it over a pipe). Each rank sees its own GPU through
 * CUDA_VISIBLE_DEVICES. Prints one line per scenario; a failure says which rank and what. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef FAKE_NCCL_PATH
#error "FAKE_NCCL_PATH and FAKE_CUDART_PATH name the built fakes (tests/fakes/CMakeLists.txt)"
#endif

/* ---- the API, from dlopen ---- */

/* The lists stay one entry per line (clang-format reflows them differently on every pass). */
/* clang-format off */
#define CUDA_FUNCS(X) \
  X(cudaGetDeviceCount) \
  X(cudaSetDevice) \
  X(cudaGetDevice) \
  X(cudaDeviceGetPCIBusId) \
  X(cudaDeviceSynchronize) \
  X(cudaRuntimeGetVersion) \
  X(cudaDriverGetVersion) \
  X(cudaGetErrorString) \
  X(cudaGetErrorName) \
  X(cudaGetLastError) \
  X(cudaPeekAtLastError) \
  X(cudaMalloc) \
  X(cudaFree) \
  X(cudaMemcpy) \
  X(cudaMemcpyAsync) \
  X(cudaMemset) \
  X(cudaMemsetAsync) \
  X(cudaPointerGetAttributes) \
  X(cudaStreamCreate) \
  X(cudaStreamCreateWithFlags) \
  X(cudaStreamDestroy) \
  X(cudaStreamQuery) \
  X(cudaStreamSynchronize) \
  X(cudaLaunchHostFunc)
#define NCCL_FUNCS(X) \
  X(ncclGetVersion) \
  X(ncclGetErrorString) \
  X(ncclGetLastError) \
  X(ncclGetUniqueId) \
  X(ncclCommInitRank) \
  X(ncclCommDestroy) \
  X(ncclCommAbort) \
  X(ncclCommFinalize) \
  X(ncclCommGetAsyncError) \
  X(ncclCommCount) \
  X(ncclCommUserRank) \
  X(ncclCommCuDevice) \
  X(ncclGroupStart) \
  X(ncclGroupEnd) \
  X(ncclAllReduce) \
  X(ncclBroadcast) \
  X(ncclAllGather) \
  X(ncclReduceScatter)
/* clang-format on */

static struct {
#define FIELD(f) __typeof__(&f) f;
  CUDA_FUNCS(FIELD) NCCL_FUNCS(FIELD)
#undef FIELD
} api;

static char g_dir[4096]; /* the temporary folder with the copies and fake-gpus.conf */
static const char* g_scenario = "setup";
static int g_rank = -1;
static int g_failures;
static unsigned g_timeout_s = 45; /* per rank process; FAKE_SELFTEST_TIMEOUT for sanitizer builds */

static void report(int line, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
static void report(int line, const char* fmt, ...) {
  char text[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  if (g_rank >= 0)
    fprintf(stderr, "fake_selftest: %s: rank %d: line %d: %s\n", g_scenario, g_rank, line, text);
  else
    fprintf(stderr, "fake_selftest: %s: line %d: %s\n", g_scenario, line, text);
  g_failures++;
}

#define CHECK(cond, ...)                                          \
  do {                                                            \
    if (!(cond)) report(__LINE__, "not " #cond ": " __VA_ARGS__); \
  } while (0)
#define EXPECT_NCCL(call, want)                                                              \
  do {                                                                                       \
    ncclResult_t got_ = (call);                                                              \
    if (got_ != (want))                                                                      \
      report(__LINE__, "%s returned %d (%s), expected %d; last error: %s", #call, (int)got_, \
             api.ncclGetErrorString(got_), (int)(want), api.ncclGetLastError(NULL));         \
  } while (0)
#define EXPECT_CUDA(call, want)                                                          \
  do {                                                                                   \
    cudaError_t got_ = (call);                                                           \
    if (got_ != (want))                                                                  \
      report(__LINE__, "%s returned %s, expected %s", #call, api.cudaGetErrorName(got_), \
             api.cudaGetErrorName(want));                                                \
  } while (0)

static void load_api(void) {
  char path[4200];
  snprintf(path, sizeof path, "%s/libnccl.so.2", g_dir);
  void* nccl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  snprintf(path, sizeof path, "%s/libcudart.so.13", g_dir);
  void* cuda = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (nccl == NULL || cuda == NULL) {
    fprintf(stderr, "fake_selftest: dlopen: %s\n", dlerror());
    _exit(2);
  }
#define LOAD(lib, f)                                            \
  if ((api.f = (__typeof__(api.f))dlsym(lib, #f)) == NULL) {    \
    fprintf(stderr, "fake_selftest: %s is not exported\n", #f); \
    _exit(2);                                                   \
  }
#define LOAD_CUDA(f) LOAD(cuda, f)
#define LOAD_NCCL(f) LOAD(nccl, f)
  CUDA_FUNCS(LOAD_CUDA)
  NCCL_FUNCS(LOAD_NCCL)
  /* libnccl resolved libcudart beside itself ($ORIGIN), i.e. the same copy. */
  void* self = dlsym(nccl, "cudaGetDeviceCount");
  if (self != NULL && self != (void*)api.cudaGetDeviceCount) {
    fprintf(stderr, "fake_selftest: libnccl.so.2 uses another libcudart.so.13\n");
    _exit(2);
  }
}

/* ---- files ---- */

static int copy_file(const char* from, const char* to) {
  int in = open(from, O_RDONLY | O_CLOEXEC), out = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
  char buf[1 << 16];
  ssize_t n = 0;
  while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof buf)) > 0)
    if (write(out, buf, (size_t)n) != n) n = -1;
  int ok = in >= 0 && out >= 0 && n == 0;
  if (in >= 0) close(in);
  if (out >= 0 && close(out) != 0) ok = 0;
  return ok;
}

static void write_conf(const char* text) {
  char path[4200];
  snprintf(path, sizeof path, "%s/fake-gpus.conf", g_dir);
  FILE* f = fopen(path, "w");
  if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
    fprintf(stderr, "fake_selftest: cannot write %s\n", path);
    exit(2);
  }
}

/* The fake's UUID of physical GPU i (fake_conf.c: FNV-1a of the host name). */
static void gpu_uuid(int i, char* out, size_t len) {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) strcpy(host, "localhost");
  unsigned h = 2166136261u;
  for (const char* p = host; *p; ++p) h = (h ^ (unsigned char)*p) * 16777619u;
  snprintf(out, len, "GPU-%08x-0000-4000-8000-%012x", h, (unsigned)i);
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static void sleep_ms(int ms) {
  struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&t, NULL);
}

/* ---- element values ---- */

enum Kind { SIGNED, UNSIGNED, FLOATING, SMALL };
static const struct {
  ncclDataType_t type;
  const char* name;
  size_t size;
  enum Kind kind;
  int ebits, mbits, bias; /* SMALL */
} k_types[] = {
    {ncclInt8, "int8", 1, SIGNED, 0, 0, 0},
    {ncclUint8, "uint8", 1, UNSIGNED, 0, 0, 0},
    {ncclInt32, "int32", 4, SIGNED, 0, 0, 0},
    {ncclUint32, "uint32", 4, UNSIGNED, 0, 0, 0},
    {ncclInt64, "int64", 8, SIGNED, 0, 0, 0},
    {ncclUint64, "uint64", 8, UNSIGNED, 0, 0, 0},
    {ncclFloat16, "float16", 2, SMALL, 5, 10, 15},
    {ncclFloat32, "float32", 4, FLOATING, 0, 0, 0},
    {ncclFloat64, "float64", 8, FLOATING, 0, 0, 0},
    {ncclBfloat16, "bfloat16", 2, SMALL, 8, 7, 127},
    {ncclFloat8e4m3, "float8e4m3", 1, SMALL, 4, 3, 7},
    {ncclFloat8e5m2, "float8e5m2", 1, SMALL, 5, 2, 15},
};
enum { NTYPES = sizeof k_types / sizeof k_types[0], T_FLOAT32 = 7 };

/* Small floats, only for values they hold exactly (the test's values are small multiples of 1/4). */
static unsigned small_encode(double v, int t) {
  int mbits = k_types[t].mbits, ebits = k_types[t].ebits, bias = k_types[t].bias;
  unsigned sign = v < 0 ? 1u << (ebits + mbits) : 0;
  v = fabs(v);
  if (v == 0) return sign;
  int e;
  double m = frexp(v, &e); /* v = m 2^e, m in [0.5, 1) */
  unsigned man = (unsigned)((m * 2 - 1) * (double)(1u << mbits));
  return sign | (unsigned)((e - 1 + bias) << mbits) | man;
}

static double small_decode(unsigned bits, int t) {
  int mbits = k_types[t].mbits, ebits = k_types[t].ebits, bias = k_types[t].bias;
  unsigned e = (bits >> mbits) & ((1u << ebits) - 1), man = bits & ((1u << mbits) - 1);
  double v =
      e == 0 ? ldexp(man, 1 - bias - mbits) : ldexp(man + (double)(1u << mbits), (int)e - bias - mbits);
  return (bits >> (ebits + mbits)) & 1 ? -v : v;
}

static void store(void* buf, size_t i, int t, double v) {
  switch (k_types[t].type) {
    case ncclInt8:
      ((int8_t*)buf)[i] = (int8_t)v;
      break;
    case ncclUint8:
      ((uint8_t*)buf)[i] = (uint8_t)v;
      break;
    case ncclInt32:
      ((int32_t*)buf)[i] = (int32_t)v;
      break;
    case ncclUint32:
      ((uint32_t*)buf)[i] = (uint32_t)v;
      break;
    case ncclInt64:
      ((int64_t*)buf)[i] = (int64_t)v;
      break;
    case ncclUint64:
      ((uint64_t*)buf)[i] = (uint64_t)v;
      break;
    case ncclFloat32:
      ((float*)buf)[i] = (float)v;
      break;
    case ncclFloat64:
      ((double*)buf)[i] = v;
      break;
    default:
      if (k_types[t].size == 2)
        ((uint16_t*)buf)[i] = (uint16_t)small_encode(v, t);
      else
        ((uint8_t*)buf)[i] = (uint8_t)small_encode(v, t);
  }
}

static double load(const void* buf, size_t i, int t) {
  switch (k_types[t].type) {
    case ncclInt8:
      return ((const int8_t*)buf)[i];
    case ncclUint8:
      return ((const uint8_t*)buf)[i];
    case ncclInt32:
      return ((const int32_t*)buf)[i];
    case ncclUint32:
      return ((const uint32_t*)buf)[i];
    case ncclInt64:
      return (double)((const int64_t*)buf)[i];
    case ncclUint64:
      return (double)((const uint64_t*)buf)[i];
    case ncclFloat32:
      return ((const float*)buf)[i];
    case ncclFloat64:
      return ((const double*)buf)[i];
    default:
      return small_decode(k_types[t].size == 2 ? ((const uint16_t*)buf)[i] : ((const uint8_t*)buf)[i], t);
  }
}

/* buf[i] = pat[(phase + i) % period], with a loop per type (the large cases stay fast). */
#define FILL(T)                                 \
  do {                                          \
    T* p = buf;                                 \
    for (size_t i = 0, k = phase; i < n; ++i) { \
      p[i] = (T)pat[k];                         \
      if (++k == period) k = 0;                 \
    }                                           \
  } while (0)
static void fill(void* buf, size_t n, int t, const double* pat, size_t period, size_t phase) {
  switch (k_types[t].type) {
    case ncclInt8:
      FILL(int8_t);
      break;
    case ncclUint8:
      FILL(uint8_t);
      break;
    case ncclInt32:
      FILL(int32_t);
      break;
    case ncclUint32:
      FILL(uint32_t);
      break;
    case ncclInt64:
      FILL(int64_t);
      break;
    case ncclUint64:
      FILL(uint64_t);
      break;
    case ncclFloat32:
      FILL(float);
      break;
    case ncclFloat64:
      FILL(double);
      break;
    default:
      for (size_t i = 0; i < n; ++i) store(buf, i, t, pat[(phase + i) % period]);
  }
}

/* The first i where buf[i] != pat[(phase + i) % period] (compared as numbers), or n. */
#define FIND(T)                                 \
  do {                                          \
    const T* p = buf;                           \
    for (size_t i = 0, k = phase; i < n; ++i) { \
      if ((double)p[i] != pat[k]) return i;     \
      if (++k == period) k = 0;                 \
    }                                           \
    return n;                                   \
  } while (0)
static size_t mismatch(const void* buf, size_t n, int t, const double* pat, size_t period, size_t phase) {
  switch (k_types[t].type) {
    case ncclInt8:
      FIND(int8_t);
    case ncclUint8:
      FIND(uint8_t);
    case ncclInt32:
      FIND(int32_t);
    case ncclUint32:
      FIND(uint32_t);
    case ncclInt64:
      FIND(int64_t);
    case ncclUint64:
      FIND(uint64_t);
    case ncclFloat32:
      FIND(float);
    case ncclFloat64:
      FIND(double);
    default:
      for (size_t i = 0; i < n; ++i)
        if (load(buf, i, t) != pat[(phase + i) % period]) return i;
      return n;
  }
}

/* Rank r's element i: in -2..2 (0..2 unsigned), so that sums, products and quarter-averages of
 * four ranks are exact in every type, fp8 included. It depends on i only modulo PERIOD(t). */
#define PERIOD(t) (k_types[t].kind == UNSIGNED ? 3 : 5)
static double value(int r, size_t i, int salt, int t) {
  long x = (long)((i * 7 + (size_t)r * 3 + (size_t)salt) % (size_t)PERIOD(t));
  return k_types[t].kind == UNSIGNED ? (double)x : (double)(x - 2);
}

static double fold(int op, int t, int nranks, size_t i, int salt) {
  double acc = value(0, i, salt, t);
  for (int r = 1; r < nranks; ++r) {
    double v = value(r, i, salt, t);
    switch (op) {
      case ncclProd:
        acc *= v;
        break;
      case ncclMax:
        acc = v > acc ? v : acc;
        break;
      case ncclMin:
        acc = v < acc ? v : acc;
        break;
      default:
        acc += v;
        break;
    }
  }
  if (op == ncclAvg)
    acc =
        k_types[t].kind == FLOATING || k_types[t].kind == SMALL ? acc / nranks : (double)(long)(acc / nranks);
  return acc;
}

/* ---- running ranks ---- */

struct Scenario {
  const char* name;
  int nprocs;
  const char* visible[8]; /* CUDA_VISIBLE_DEVICES per process; NULL: unset */
  const char* conf;
  void (*body)(int rank, int nprocs, ncclUniqueId id, int progress_fd);
  int victim; /* >= 0: the parent SIGKILLs this rank once it writes to progress_fd */
};

static int run_scenario(const struct Scenario* s) {
  write_conf(s->conf);
  double start = now_s();
  int id_pipe[8][2], progress[2];
  if (pipe(progress) != 0) return 0;
  for (int r = 0; r < s->nprocs; ++r)
    if (pipe(id_pipe[r]) != 0) return 0;
  pid_t pids[8];
  fflush(stdout);
  fflush(stderr);
  for (int r = 0; r < s->nprocs; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) return 0;
    if (pids[r] > 0) continue;
    g_scenario = s->name;
    g_rank = r;
    alarm(g_timeout_s);
    signal(SIGPIPE, SIG_IGN);
    close(progress[0]);
    if (s->visible[r])
      setenv("CUDA_VISIBLE_DEVICES", s->visible[r], 1);
    else
      unsetenv("CUDA_VISIBLE_DEVICES");
    load_api();
    ncclUniqueId id;
    memset(&id, 0, sizeof id);
    if (r == 0) {
      EXPECT_NCCL(api.ncclGetUniqueId(&id), ncclSuccess);
      for (int k = 1; k < s->nprocs; ++k)
        if (write(id_pipe[k][1], &id, sizeof id) != (ssize_t)sizeof id)
          report(__LINE__, "cannot pass the id");
    } else if (read(id_pipe[r][0], &id, sizeof id) != (ssize_t)sizeof id) {
      report(__LINE__, "no unique id from rank 0");
      _exit(1);
    }
    s->body(r, s->nprocs, id, progress[1]);
    _exit(g_failures ? 1 : 0);
  }
  close(progress[1]);
  for (int r = 0; r < s->nprocs; ++r) close(id_pipe[r][0]), close(id_pipe[r][1]);
  if (s->victim >= 0) {
    char who;
    while (read(progress[0], &who, 1) == 1)
      if (who == s->victim) {
        kill(pids[s->victim], SIGKILL);
        break;
      }
  }
  int ok = 1;
  for (int r = 0; r < s->nprocs; ++r) {
    int status = 0;
    while (waitpid(pids[r], &status, 0) < 0 && errno == EINTR) {
    }
    int want_kill = r == s->victim;
    if (want_kill ? !(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
                  : !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      ok = 0;
      if (WIFSIGNALED(status))
        fprintf(stderr, "fake_selftest: %s: rank %d died of signal %d%s\n", s->name, r, WTERMSIG(status),
                WTERMSIG(status) == SIGALRM ? " (timed out: FAKE_SELFTEST_TIMEOUT)" : "");
      else if (want_kill)
        fprintf(stderr, "fake_selftest: %s: rank %d should have been killed\n", s->name, r);
    }
  }
  close(progress[0]);
  printf("fake_selftest: %-22s %s (%.2f s)\n", s->name, ok ? "ok" : "FAILED", now_s() - start);
  return ok;
}

/* Polls like a training loop: until the stream is done or the communicator reports an error.
 * The stream first: a peer's failure may reach this rank just after its own operation finished,
 * and the test wants to attribute the error to the operation that cannot finish. */
static ncclResult_t wait_stream(ncclComm_t comm, cudaStream_t stream) {
  for (int i = 0; i < 20000; ++i) {
    cudaError_t q = api.cudaStreamQuery(stream);
    if (q == cudaSuccess) return ncclSuccess;
    if (q != cudaErrorNotReady) {
      report(__LINE__, "cudaStreamQuery: %s", api.cudaGetErrorName(q));
      return ncclInternalError;
    }
    ncclResult_t async = ncclSuccess;
    EXPECT_NCCL(api.ncclCommGetAsyncError(comm, &async), ncclSuccess);
    if (async != ncclSuccess) return async;
    sleep_ms(1);
  }
  report(__LINE__, "the stream did not finish in 20 s and no error was reported");
  return ncclInternalError;
}

static ncclComm_t init_or_die(int nranks, ncclUniqueId id, int rank) {
  ncclComm_t comm = NULL;
  ncclResult_t res = api.ncclCommInitRank(&comm, nranks, id, rank);
  if (res != ncclSuccess) {
    report(__LINE__, "ncclCommInitRank: %s: %s", api.ncclGetErrorString(res), api.ncclGetLastError(NULL));
    _exit(1);
  }
  return comm;
}

/* ---- scenarios ---- */

enum { C_ALLREDUCE, C_BROADCAST, C_ALLGATHER, C_REDUCESCATTER };
static const char* const k_colls[] = {"allreduce", "broadcast", "allgather", "reducescatter"};

/* One collective, checked against the reference; returns 0 on a mismatch. */
static int one_collective(ncclComm_t comm, cudaStream_t stream, int rank, int nranks, int coll, int t, int op,
                          size_t count, int in_place, int device_memory, int salt) {
  size_t es = k_types[t].size, n = (size_t)nranks;
  size_t send_n = coll == C_REDUCESCATTER ? n * count : count;
  size_t recv_n = coll == C_ALLGATHER ? n * count : count;
  size_t buf_n = in_place ? (send_n > recv_n ? send_n : recv_n) : send_n + recv_n;
  char* buf = NULL;
  size_t bytes = (buf_n ? buf_n : 1) * es;
  if (device_memory)
    EXPECT_CUDA(api.cudaMalloc((void**)&buf, bytes), cudaSuccess);
  else
    buf = malloc(bytes);
  if (buf == NULL) {
    report(__LINE__, "out of memory");
    return 0;
  }
  if (count == 0) memset(buf, 0x5a, bytes);
  char *send = buf, *recv = in_place ? buf : buf + send_n * es;
  if (in_place && coll == C_ALLGATHER) send = buf + (size_t)rank * count * es;
  if (in_place && coll == C_REDUCESCATTER) recv = buf + (size_t)rank * count * es;
  int root = salt % nranks;
  size_t period = (size_t)PERIOD(t);
  /* Element values and results depend on the index only modulo the period. */
  double mine[5], folded[5], vals[8][5];
  for (size_t k = 0; k < period; ++k) {
    mine[k] = value(rank, k, salt, t);
    folded[k] = fold(op, t, nranks, k, salt);
    for (int r = 0; r < nranks && r < 8; ++r) vals[r][k] = value(r, k, salt, t);
  }
  fill(send, send_n, t, mine, period, 0);
  ncclResult_t res = ncclInternalError;
  ncclDataType_t type = k_types[t].type;
  switch (coll) {
    case C_ALLREDUCE:
      res = api.ncclAllReduce(send, recv, count, type, op, comm, stream);
      break;
    case C_BROADCAST:
      res = api.ncclBroadcast(send, recv, count, type, root, comm, stream);
      break;
    case C_ALLGATHER:
      res = api.ncclAllGather(send, recv, count, type, comm, stream);
      break;
    case C_REDUCESCATTER:
      res = api.ncclReduceScatter(send, recv, count, type, op, comm, stream);
      break;
  }
  int ok = res == ncclSuccess;
  if (!ok) report(__LINE__, "%s: %s", k_colls[coll], api.ncclGetLastError(comm));
  EXPECT_CUDA(api.cudaStreamSynchronize(stream), cudaSuccess);
  unsigned char sentinel[8];
  memset(sentinel, 0x5a, sizeof sentinel);
  /* Compare block by block (all-gather: one block per rank) against the period's pattern. */
  for (size_t block = 0; ok && count > 0 && block < recv_n / count; ++block) {
    const double* pat = folded;
    size_t phase = 0;
    if (coll == C_BROADCAST) pat = vals[root];
    if (coll == C_ALLGATHER) pat = vals[block];
    if (coll == C_REDUCESCATTER) phase = ((size_t)rank * count) % period;
    const char* got = recv + block * count * es;
    size_t i = mismatch(got, count, t, pat, period, phase);
    if (i < count) {
      report(__LINE__, "%s %s op %d count %zu %s %s: element %zu is %g, expected %g", k_colls[coll],
             k_types[t].name, op, count, in_place ? "in place" : "out of place",
             device_memory ? "device" : "host", block * count + i, load(got, i, t),
             pat[(phase + i) % period]);
      ok = 0;
    }
  }
  /* An empty collective writes nothing at all. */
  if (!in_place && count == 0 && memcmp(recv, sentinel, es) != 0) {
    report(__LINE__, "%s with count 0 wrote to recvbuff", k_colls[coll]);
    ok = 0;
  }
  if (device_memory)
    EXPECT_CUDA(api.cudaFree(buf), cudaSuccess);
  else
    free(buf);
  return ok;
}

static void body_collectives(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  (void)progress_fd;
  int version = 0, count = 0, dev = -1;
  EXPECT_NCCL(api.ncclGetVersion(&version), ncclSuccess);
  CHECK(version == 22703, "ncclGetVersion says %d, fake-gpus.conf says 22703", version);
  EXPECT_CUDA(api.cudaGetDeviceCount(&count), cudaSuccess);
  CHECK(count == 1, "CUDA_VISIBLE_DEVICES=%d shows %d devices", rank, count);
  EXPECT_CUDA(api.cudaGetDevice(&dev), cudaSuccess);
  char bus[32] = "", want_bus[32];
  EXPECT_CUDA(api.cudaDeviceGetPCIBusId(bus, sizeof bus, 0), cudaSuccess);
  snprintf(want_bus, sizeof want_bus, "00000000:%02X:00.0", 0x18 + rank);
  CHECK(strcmp(bus, want_bus) == 0, "bus id %s, expected %s", bus, want_bus);

  ncclComm_t comm = init_or_die(nranks, id, rank);
  int n = 0, r = -1, d = -1;
  EXPECT_NCCL(api.ncclCommCount(comm, &n), ncclSuccess);
  EXPECT_NCCL(api.ncclCommUserRank(comm, &r), ncclSuccess);
  EXPECT_NCCL(api.ncclCommCuDevice(comm, &d), ncclSuccess);
  CHECK(n == nranks && r == rank && d == 0, "count %d rank %d device %d", n, r, d);
  cudaStream_t streams[2] = {NULL, NULL};
  EXPECT_CUDA(api.cudaStreamCreate(&streams[0]), cudaSuccess);

  /* Every collective x op x type, in and out of place, host and device memory, both streams. */
  int iteration = 0;
  for (int t = 0; t < NTYPES; ++t)
    for (int coll = 0; coll < 4; ++coll) {
      int reducing = coll == C_ALLREDUCE || coll == C_REDUCESCATTER;
      for (int op = 0; op < (reducing ? 5 : 1); ++op)
        for (int in_place = 0; in_place < 2; ++in_place) {
          static const size_t float_sizes[] = {0, 1, 1000003}, other_sizes[] = {0, 1, 37};
          for (int k = 0; k < 3; ++k, ++iteration) {
            size_t cnt = t == T_FLOAT32 ? float_sizes[k] : other_sizes[k];
            one_collective(comm, streams[iteration % 2], rank, nranks, coll, t, op, cnt, in_place,
                           iteration % 3 != 0, iteration);
          }
        }
    }

  /* Half and bfloat16 round to nearest even: 2048+1 -> 2048, 2048+3 -> 2052; 256+1 -> 256, 256+3 -> 260. */
  uint16_t half[2] = {rank == 0   ? 0x6800
                      : rank == 1 ? 0x3c00
                                  : 0,
                      rank == 0   ? 0x6800
                      : rank == 1 ? 0x4200
                                  : 0};
  uint16_t bf[2] = {rank == 0 ? 0x4380 : rank == 1 ? 0x3f80 : 0, rank == 0 ? 0x4380 : rank == 1 ? 0x4040 : 0};
  EXPECT_NCCL(api.ncclAllReduce(half, half, 2, ncclFloat16, ncclSum, comm, streams[0]), ncclSuccess);
  EXPECT_NCCL(api.ncclAllReduce(bf, bf, 2, ncclBfloat16, ncclSum, comm, streams[0]), ncclSuccess);
  EXPECT_CUDA(api.cudaStreamSynchronize(streams[0]), cudaSuccess);
  CHECK(half[0] == 0x6800 && half[1] == 0x6802, "float16 sums %04x %04x, expected 6800 6802", half[0],
        half[1]);
  CHECK(bf[0] == 0x4380 && bf[1] == 0x4382, "bfloat16 sums %04x %04x, expected 4380 4382", bf[0], bf[1]);

  /* Bad arguments are refused at once, and leave the communicator usable. */
  float x[4] = {1, 1, 1, 1};
  EXPECT_NCCL(api.ncclAllReduce(x, x, 4, (ncclDataType_t)99, ncclSum, comm, streams[0]), ncclInvalidArgument);
  EXPECT_NCCL(api.ncclAllReduce(x, x, 4, ncclFloat32, (ncclRedOp_t)42, comm, streams[0]),
              ncclInvalidArgument);
  EXPECT_NCCL(api.ncclBroadcast(x, x, 4, ncclFloat32, nranks, comm, streams[0]), ncclInvalidArgument);
  EXPECT_NCCL(api.ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, NULL, streams[0]), ncclInvalidArgument);
  EXPECT_NCCL(api.ncclAllReduce(x, NULL, 4, ncclFloat32, ncclSum, comm, streams[0]), ncclInvalidArgument);
  EXPECT_NCCL(api.ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, streams[0]), ncclSuccess);
  EXPECT_CUDA(api.cudaStreamSynchronize(streams[0]), cudaSuccess);
  CHECK(x[0] == nranks && x[3] == nranks, "after the refused calls the sum is %g", x[0]);

  /* Pointer attributes: cudaMalloc'ed memory is the device's, anything else unregistered. */
  char* dptr = NULL;
  struct cudaPointerAttributes attr;
  EXPECT_CUDA(api.cudaMalloc((void**)&dptr, 1000), cudaSuccess);
  CHECK(((uintptr_t)dptr & 255) == 0, "cudaMalloc is not 256-byte aligned: %p", (void*)dptr);
  EXPECT_CUDA(api.cudaPointerGetAttributes(&attr, dptr + 999), cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeDevice && attr.device == 0 && attr.devicePointer == dptr + 999,
        "attributes of device memory: type %d device %d", (int)attr.type, attr.device);
  EXPECT_CUDA(api.cudaPointerGetAttributes(&attr, x), cudaSuccess);
  CHECK(attr.type == cudaMemoryTypeUnregistered, "attributes of a stack array: type %d", (int)attr.type);
  EXPECT_CUDA(api.cudaFree(dptr), cudaSuccess);

  /* Ranks that disagree: rank 3 passes another count. Every rank gets ncclInvalidUsage. */
  float y[11] = {0};
  EXPECT_NCCL(api.ncclAllReduce(y, y, rank == 3 ? 11 : 10, ncclFloat32, ncclSum, comm, streams[0]),
              ncclSuccess);
  ncclResult_t async = wait_stream(comm, streams[0]);
  CHECK(async == ncclInvalidUsage, "a mismatched collective gave %d", (int)async);
  const char* last = api.ncclGetLastError(comm);
  CHECK(strstr(last, "mismatch") && strstr(last, "rank 3"), "last error: %s", last);
  /* A failed communicator refuses new work with its error, as NCCL's does. */
  EXPECT_NCCL(api.ncclAllReduce(x, x, 4, ncclFloat32, ncclSum, comm, streams[0]), ncclInvalidUsage);
  EXPECT_NCCL(api.ncclCommAbort(comm), ncclSuccess);
  EXPECT_CUDA(api.cudaStreamSynchronize(streams[0]), cudaSuccess);
  EXPECT_CUDA(api.cudaStreamDestroy(streams[0]), cudaSuccess);
}

static void body_duplicate_gpu(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  (void)progress_fd;
  ncclComm_t comm = NULL;
  EXPECT_NCCL(api.ncclCommInitRank(&comm, nranks, id, rank), ncclInvalidUsage);
  CHECK(comm == NULL, "a refused init returned a communicator");
  char want[128];
  snprintf(want, sizeof want, "Duplicate GPU detected : rank %d and rank %d both on CUDA device 18000", rank,
           rank == 1 ? 0 : 1);
  const char* last = api.ncclGetLastError(NULL);
  if (rank <= 1)
    CHECK(strcmp(last, want) == 0, "last error \"%s\", expected \"%s\"", last, want);
  else
    CHECK(strstr(last, "Duplicate GPU detected : rank 0 and rank 1") != NULL, "last error: %s", last);
}

static void body_nonce(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  (void)progress_fd;
  if (rank == 1) {
    /* Bytes 24..31 of the fake's id are its nonce (tests/fakes/README.md). */
    ncclUniqueId stale = id;
    stale.internal[24] ^= 0x55;
    ncclComm_t bad = NULL;
    EXPECT_NCCL(api.ncclCommInitRank(&bad, nranks, stale, rank), ncclInvalidArgument);
    CHECK(strstr(api.ncclGetLastError(NULL), "unique id") != NULL, "last error: %s",
          api.ncclGetLastError(NULL));
    ncclUniqueId zero;
    memset(&zero, 0, sizeof zero);
    EXPECT_NCCL(api.ncclCommInitRank(&bad, nranks, zero, rank), ncclInvalidArgument);
    EXPECT_NCCL(api.ncclCommInitRank(&bad, nranks, id, nranks), ncclInvalidArgument);
  }
  /* The refused rank does not spoil the communicator: with the right id everyone joins. */
  ncclComm_t comm = init_or_die(nranks, id, rank);
  int64_t v[3] = {rank + 1, 10 * (rank + 1), -rank};
  EXPECT_NCCL(api.ncclGroupStart(), ncclSuccess);
  EXPECT_NCCL(api.ncclAllReduce(v, v, 3, ncclInt64, ncclSum, comm, NULL), ncclSuccess);
  EXPECT_NCCL(api.ncclGroupEnd(), ncclSuccess);
  EXPECT_CUDA(api.cudaStreamSynchronize(NULL), cudaSuccess);
  CHECK(v[0] == 3 && v[1] == 30 && v[2] == -1, "sums %lld %lld %lld", (long long)v[0], (long long)v[1],
        (long long)v[2]);
  if (rank == 1) {
    /* Rank 0 destroyed its communicator and its process (the root's) exited: an idle rank sees no error. */
    sleep_ms(300);
    ncclResult_t async = ncclInternalError;
    EXPECT_NCCL(api.ncclCommGetAsyncError(comm, &async), ncclSuccess);
    CHECK(async == ncclSuccess, "after a clean goodbye the async error is %d: %s", (int)async,
          api.ncclGetLastError(comm));
  }
  EXPECT_NCCL(api.ncclCommFinalize(comm), ncclSuccess);
  EXPECT_NCCL(api.ncclCommDestroy(comm), ncclSuccess);
}

static void body_rank_twice(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  (void)progress_fd;
  ncclComm_t comm = NULL;
  EXPECT_NCCL(api.ncclCommInitRank(&comm, nranks, id, rank == 2 ? 1 : rank), ncclInvalidUsage);
  const char* last = api.ncclGetLastError(NULL);
  CHECK(strstr(last, "rank 1 joined twice") != NULL, "last error: %s", last);
}

static void body_nranks_differ(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  (void)progress_fd;
  (void)nranks;
  ncclComm_t comm = NULL;
  EXPECT_NCCL(api.ncclCommInitRank(&comm, rank == 1 ? 3 : 2, id, rank), ncclInvalidUsage);
}

/* Loops all-reduces until the communicator fails; returns the error and its iteration. */
static ncclResult_t loop_until_error(ncclComm_t comm, cudaStream_t stream, int rank, int* iteration,
                                     int progress_fd) {
  float buf[1024];
  for (int i = 0; i < 100000; ++i) {
    for (int k = 0; k < 1024; ++k) buf[k] = (float)rank;
    ncclResult_t res = api.ncclAllReduce(buf, buf, 1024, ncclFloat32, ncclSum, comm, stream);
    if (res != ncclSuccess) {
      *iteration = i;
      return res;
    }
    res = wait_stream(comm, stream);
    *iteration = i;
    if (res != ncclSuccess) return res;
    if (buf[0] != 6.0f || buf[1023] != 6.0f) {
      report(__LINE__, "iteration %d: sum %g, expected 6", i, buf[0]);
      return ncclInternalError;
    }
    if (i == 5) {
      char me = (char)rank;
      if (write(progress_fd, &me, 1) != 1) report(__LINE__, "cannot signal progress");
    }
  }
  report(__LINE__, "no error in 100000 iterations");
  return ncclSuccess;
}

static void expect_drain_after_abort(ncclComm_t comm, cudaStream_t stream) {
  EXPECT_NCCL(api.ncclCommAbort(comm), ncclSuccess);
  EXPECT_CUDA(api.cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_CUDA(api.cudaStreamQuery(stream), cudaSuccess);
}

static void body_injected(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  ncclComm_t comm = init_or_die(nranks, id, rank);
  cudaStream_t stream;
  EXPECT_CUDA(api.cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  int iteration = -1;
  ncclResult_t res = loop_until_error(comm, stream, rank, &iteration, progress_fd);
  const char* last = api.ncclGetLastError(comm);
  CHECK(iteration == 3, "the error came at iteration %d, expected 3 (async_error_after 3)", iteration);
  if (rank == 2) {
    CHECK(res == ncclSystemError, "rank 2 got %d", (int)res);
    CHECK(strcmp(last, "injected async error (fake-gpus.conf)") == 0, "last error: %s", last);
    EXPECT_CUDA(api.cudaStreamQuery(stream), cudaErrorNotReady); /* blocked until the abort */
  } else {
    CHECK(res == ncclRemoteError, "got %d", (int)res);
    CHECK(strstr(last, "remote process exited or there was a network error") && strstr(last, "rank 2"),
          "last error: %s", last);
  }
  expect_drain_after_abort(comm, stream);
}

static void body_killed(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  ncclComm_t comm = init_or_die(nranks, id, rank);
  int iteration = -1;
  ncclResult_t res = loop_until_error(comm, NULL, rank, &iteration, progress_fd);
  const char* last = api.ncclGetLastError(comm);
  CHECK(res == ncclRemoteError, "got %d: %s", (int)res, last);
  CHECK(strstr(last, "remote process exited or there was a network error") != NULL, "last error: %s", last);
  expect_drain_after_abort(comm, NULL);
}

static void body_killed_rank3(int rank, int nranks, ncclUniqueId id, int progress_fd) {
  body_killed(rank, nranks, id, progress_fd);
  CHECK(strstr(api.ncclGetLastError(NULL), "rank 3") != NULL, "last error: %s", api.ncclGetLastError(NULL));
}

/* ---- the fake cudart alone, one process per CUDA_VISIBLE_DEVICES ---- */

static void host_fn_append(void* arg) {
  int* log = arg;
  log[1 + log[0]] = log[0];
  log[0]++;
}

static int g_gate[2];
static volatile int g_gate_passed;
static void host_fn_gate(void* arg) {
  (void)arg;
  char c;
  if (read(g_gate[0], &c, 1) != 1) {
  }
  g_gate_passed = 1;
}

static void host_fn_sleep_then_flag(void* arg) {
  sleep_ms(50);
  *(volatile int*)arg = 1;
}

static void cudart_checks(int which) {
  char uuid1[64];
  gpu_uuid(1, uuid1, sizeof uuid1);
  int count = -1;
  if (which == 0) {
    /* Unset: every GPU of the conf. */
    EXPECT_CUDA(api.cudaGetDeviceCount(&count), cudaSuccess);
    CHECK(count == 4, "%d devices", count);
    int v = 0;
    EXPECT_CUDA(api.cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK(v == 13000, "runtime version %d", v);
    EXPECT_CUDA(api.cudaDriverGetVersion(&v), cudaSuccess);
    CHECK(strcmp(api.cudaGetErrorString(cudaErrorNoDevice), "no CUDA-capable device is detected") == 0, "%s",
          api.cudaGetErrorString(cudaErrorNoDevice));
    CHECK(strcmp(api.ncclGetErrorString(ncclRemoteError),
                 "remote process exited or there was a network error") == 0,
          "%s", api.ncclGetErrorString(ncclRemoteError));
    EXPECT_CUDA(api.cudaSetDevice(4), cudaErrorInvalidDevice);
    EXPECT_CUDA(api.cudaPeekAtLastError(), cudaErrorInvalidDevice);
    EXPECT_CUDA(api.cudaGetLastError(), cudaErrorInvalidDevice);
    EXPECT_CUDA(api.cudaGetLastError(), cudaSuccess);
    EXPECT_CUDA(api.cudaSetDevice(3), cudaSuccess);
    int dev = -1;
    EXPECT_CUDA(api.cudaGetDevice(&dev), cudaSuccess);
    CHECK(dev == 3, "device %d after cudaSetDevice(3)", dev);

    /* Host functions run in order, asynchronously. */
    cudaStream_t s, nb;
    EXPECT_CUDA(api.cudaStreamCreate(&s), cudaSuccess);
    int log[1 + 200] = {0};
    for (int i = 0; i < 200; ++i) EXPECT_CUDA(api.cudaLaunchHostFunc(s, host_fn_append, log), cudaSuccess);
    EXPECT_CUDA(api.cudaStreamSynchronize(s), cudaSuccess);
    int in_order = log[0] == 200;
    for (int i = 0; i < 200 && in_order; ++i) in_order = log[1 + i] == i;
    CHECK(in_order, "host functions ran out of order (%d ran)", log[0]);

    /* Async copies and sets keep stream order; cudaMemcpy (legacy stream) waits for blocking streams. */
    char *d = NULL, host[64];
    EXPECT_CUDA(api.cudaMalloc((void**)&d, 64), cudaSuccess);
    volatile int flag = 0;
    EXPECT_CUDA(api.cudaLaunchHostFunc(s, host_fn_sleep_then_flag, (void*)&flag), cudaSuccess);
    EXPECT_CUDA(api.cudaMemsetAsync(d, 7, 64, s), cudaSuccess);
    EXPECT_CUDA(api.cudaMemcpy(host, d, 64, cudaMemcpyDeviceToHost), cudaSuccess);
    CHECK(flag == 1 && host[0] == 7 && host[63] == 7, "cudaMemcpy did not wait for the blocking stream");

    /* A non-blocking stream does not hold up the legacy stream; Query says not ready while it works. */
    if (pipe(g_gate) != 0) report(__LINE__, "pipe");
    EXPECT_CUDA(api.cudaStreamCreateWithFlags(&nb, cudaStreamNonBlocking), cudaSuccess);
    EXPECT_CUDA(api.cudaLaunchHostFunc(nb, host_fn_gate, NULL), cudaSuccess);
    EXPECT_CUDA(api.cudaMemset(d, 1, 64), cudaSuccess);
    EXPECT_CUDA(api.cudaStreamQuery(nb), cudaErrorNotReady);
    EXPECT_CUDA(api.cudaGetLastError(), cudaSuccess); /* not ready is not an error */
    /* Destroying a busy stream returns at once; its work still runs. */
    EXPECT_CUDA(api.cudaStreamDestroy(nb), cudaSuccess);
    if (write(g_gate[1], "x", 1) != 1) report(__LINE__, "write");
    EXPECT_CUDA(api.cudaDeviceSynchronize(), cudaSuccess);
    CHECK(g_gate_passed, "the destroyed stream's work did not run");
    EXPECT_CUDA(api.cudaStreamDestroy(nb), cudaErrorInvalidResourceHandle);
    EXPECT_CUDA(api.cudaMemcpyAsync(host, d, 64, cudaMemcpyDefault, cudaStreamPerThread), cudaSuccess);
    EXPECT_CUDA(api.cudaStreamSynchronize(cudaStreamLegacy), cudaSuccess);
    CHECK(host[0] == 1 && host[63] == 1, "cudaMemset then copy gave %d", host[0]);
    EXPECT_CUDA(api.cudaMemcpy(host, d, 64, (enum cudaMemcpyKind)9), cudaErrorInvalidMemcpyDirection);
    EXPECT_CUDA(api.cudaFree(host), cudaErrorInvalidValue);
    EXPECT_CUDA(api.cudaFree(d), cudaSuccess);
    EXPECT_CUDA(api.cudaStreamDestroy(s), cudaSuccess);

    /* The root listens where NCCL_SOCKET_IFNAME says; a name that matches nothing is refused. */
    ncclUniqueId id;
    setenv("NCCL_SOCKET_IFNAME", "lo", 1);
    EXPECT_NCCL(api.ncclGetUniqueId(&id), ncclSuccess);
    const unsigned char* a = (const unsigned char*)id.internal + 12;
    CHECK(a[0] == 127 && a[1] == 0 && a[2] == 0 && a[3] == 1, "root at %u.%u.%u.%u", a[0], a[1], a[2], a[3]);
    setenv("NCCL_SOCKET_IFNAME", "=nosuchif0", 1);
    EXPECT_NCCL(api.ncclGetUniqueId(&id), ncclInvalidUsage);
    CHECK(strstr(api.ncclGetLastError(NULL), "no socket interface found") != NULL, "%s",
          api.ncclGetLastError(NULL));
    unsetenv("NCCL_SOCKET_IFNAME");
  } else if (which == 1) {
    /* Indices and UUID prefixes; the list ends at the first invalid entry (7). */
    char list[128];
    snprintf(list, sizeof list, "2,%s,7,0", uuid1);
    setenv("CUDA_VISIBLE_DEVICES", list, 1);
    EXPECT_CUDA(api.cudaGetDeviceCount(&count), cudaSuccess);
    CHECK(count == 2, "CUDA_VISIBLE_DEVICES=%s shows %d devices", list, count);
    char bus[32] = "";
    EXPECT_CUDA(api.cudaDeviceGetPCIBusId(bus, sizeof bus, 0), cudaSuccess);
    CHECK(strcmp(bus, "00000000:1A:00.0") == 0, "device 0 is %s", bus);
    EXPECT_CUDA(api.cudaDeviceGetPCIBusId(bus, sizeof bus, 1), cudaSuccess);
    CHECK(strcmp(bus, "00000000:19:00.0") == 0, "device 1 is %s", bus);
    EXPECT_CUDA(api.cudaDeviceGetPCIBusId(bus, sizeof bus, 2), cudaErrorInvalidDevice);
  } else {
    /* No device: NCCL cannot start. */
    setenv("CUDA_VISIBLE_DEVICES", "", 1);
    EXPECT_CUDA(api.cudaGetDeviceCount(&count), cudaErrorNoDevice);
    CHECK(count == 0, "%d devices", count);
    int dev = -1;
    EXPECT_CUDA(api.cudaGetDevice(&dev), cudaErrorNoDevice);
    void* p = (void*)1;
    EXPECT_CUDA(api.cudaMalloc(&p, 16), cudaErrorNoDevice);
    ncclUniqueId id;
    EXPECT_NCCL(api.ncclGetUniqueId(&id), ncclSuccess);
    ncclComm_t comm = NULL;
    EXPECT_NCCL(api.ncclCommInitRank(&comm, 1, id, 0), ncclUnhandledCudaError);
  }
}

static int run_cudart(void) {
  g_scenario = "cudart";
  write_conf("* gpus 4\n");
  double start = now_s();
  int ok = 1;
  for (int which = 0; which < 3; ++which) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
      alarm(g_timeout_s);
      unsetenv("CUDA_VISIBLE_DEVICES");
      unsetenv("NCCL_SOCKET_IFNAME");
      g_rank = which;
      load_api();
      cudart_checks(which);
      _exit(g_failures ? 1 : 0);
    }
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ok = 0;
  }
  printf("fake_selftest: %-22s %s (%.2f s)\n", "cudart", ok ? "ok" : "FAILED", now_s() - start);
  return ok;
}

int main(void) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  const char* timeout = getenv("FAKE_SELFTEST_TIMEOUT");
  if (timeout && atoi(timeout) > 0) g_timeout_s = (unsigned)atoi(timeout);
  const char* tmp = getenv("TMPDIR");
  snprintf(g_dir, sizeof g_dir, "%s/fake_selftest.XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (mkdtemp(g_dir) == NULL) {
    perror("fake_selftest: mkdtemp");
    return 2;
  }
  char to[4200];
  snprintf(to, sizeof to, "%s/libnccl.so.2", g_dir);
  int copied = copy_file(FAKE_NCCL_PATH, to);
  snprintf(to, sizeof to, "%s/libcudart.so.13", g_dir);
  copied = copied && copy_file(FAKE_CUDART_PATH, to);
  if (!copied) {
    fprintf(stderr, "fake_selftest: cannot copy %s and %s into %s\n", FAKE_NCCL_PATH, FAKE_CUDART_PATH,
            g_dir);
    return 2;
  }
  /* Keep the ranks' own NCCL settings out of the test. */
  unsetenv("NCCL_SOCKET_IFNAME");
  unsetenv("NCCL_HOSTID");
  unsetenv("NCCL_DEBUG");

  static const char k_conf[] = "* gpus 4\n* nccl_version 22703\n";
  static const char k_conf_injected[] = "* gpus 4\n* async_error_rank 2\n* async_error_after 3\n";
  const struct Scenario scenarios[] = {
      {"collectives", 4, {"0", "1", "2", "3"}, k_conf, body_collectives, -1},
      {"duplicate GPU", 4, {"0", "GPU-", "2", "3"}, k_conf, body_duplicate_gpu, -1},
      {"stale id", 2, {"0", "1"}, k_conf, body_nonce, -1},
      {"rank twice", 3, {"0", "1", "2"}, k_conf, body_rank_twice, -1},
      {"nranks differ", 2, {"0", "1"}, k_conf, body_nranks_differ, -1},
      {"injected async error", 4, {"0", "1", "2", "3"}, k_conf_injected, body_injected, -1},
      {"killed rank", 4, {"0", "1", "2", "3"}, k_conf, body_killed_rank3, 3},
      {"killed root's process", 4, {"0", "1", "2", "3"}, k_conf, body_killed, 0},
  };
  int ok = run_cudart();
  char uuid0[64];
  gpu_uuid(0, uuid0, sizeof uuid0);
  for (size_t i = 0; i < sizeof scenarios / sizeof scenarios[0]; ++i) {
    struct Scenario s = scenarios[i];
    if (strcmp(s.name, "duplicate GPU") == 0) s.visible[1] = uuid0; /* GPU 0 again, by its UUID */
    ok &= run_scenario(&s);
  }
  snprintf(to, sizeof to, "%s/libnccl.so.2", g_dir);
  unlink(to);
  snprintf(to, sizeof to, "%s/libcudart.so.13", g_dir);
  unlink(to);
  snprintf(to, sizeof to, "%s/fake-gpus.conf", g_dir);
  unlink(to);
  rmdir(g_dir);
  if (!ok) fprintf(stderr, "fake_selftest: FAILED\n");
  return ok ? 0 : 1;
}
