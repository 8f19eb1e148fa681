/* Fake libnccl.so.2 for GPU-less CI (tests/fakes/README.md).
 *
 * ncclGetUniqueId starts a root thread listening on TCP; the id carries its address and a nonce.
 * Every rank connects to the root (blocking init), and each collective is a host function on the
 * caller's stream (the fake cudart runs it on the stream's thread) that sends this rank's header
 * and data to the root and writes the root's answer into recvbuff. The root computes the result
 * once all ranks' contributions for that operation arrived. A rank whose connection closes without
 * a goodbye (killed, aborted) fails the communicator: the root tells every other rank, whose
 * pending collective then blocks until ncclCommAbort, as real NCCL's would.
 *
 * Threads: per process, one root thread accepting plus one thread per connected rank for each id
 * made here; per communicator, one reader of the root's messages. Nothing polls: everything blocks
 * on a socket or a condition variable. */
#define _GNU_SOURCE
#pragma GCC visibility push(default)
#include <nccl.h>
#pragma GCC visibility pop

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fake_conf.h"

/* ---- wire format (version it when it changes) ---- */

enum { WIRE_MAGIC = 0x6e43466bu /* "kFCn" */, WIRE_VERSION = 1, MSG_TEXT = 256 };
static const char k_id_magic[8] = {'f', 'a', 'k', 'e', 'N', 'C', 'C', 'L'};

/* What ncclUniqueId holds. */
struct FakeId {
  char magic[8];
  uint32_t version;
  uint32_t addr; /* IPv4, network order */
  uint16_t port; /* network order */
  uint16_t reserved;
  uint32_t pid;
  uint64_t nonce;
  char host[96];
};
_Static_assert(sizeof(struct FakeId) == NCCL_UNIQUE_ID_BYTES, "the id fills ncclUniqueId");

/* Rank -> root, once. */
struct Hello {
  uint32_t magic, version;
  uint64_t nonce;
  int32_t nranks, rank, pid, device;
  char host[128];
  char host_id[192]; /* what tells machines apart, as NCCL's host hash */
  char bus_id[32];
};
struct HelloReply {
  uint32_t magic;
  int32_t status;
  char msg[MSG_TEXT];
};

enum { MSG_COLL = 1, MSG_BYE = 2 };    /* rank -> root */
enum { MSG_RESULT = 1, MSG_FAIL = 2 }; /* root -> rank */
enum Coll { COLL_ALLREDUCE, COLL_BROADCAST, COLL_ALLGATHER, COLL_REDUCESCATTER };

struct CollHeader {
  uint32_t magic, kind;
  uint64_t seq;
  int32_t coll, dtype, op, root;
  uint64_t count, bytes;
};
struct Reply {
  uint32_t magic, kind;
  uint64_t seq;
  int32_t status, reserved;
  uint64_t bytes;
  char msg[MSG_TEXT];
};

static const char* const k_coll_names[] = {"ncclAllReduce", "ncclBroadcast", "ncclAllGather",
                                           "ncclReduceScatter"};
static const char* const k_type_names[] = {"ncclInt8",    "ncclUint8",    "ncclInt32",      "ncclUint32",
                                           "ncclInt64",   "ncclUint64",   "ncclFloat16",    "ncclFloat32",
                                           "ncclFloat64", "ncclBfloat16", "ncclFloat8e4m3", "ncclFloat8e5m2"};
static const char* const k_op_names[] = {"ncclSum", "ncclProd", "ncclMax", "ncclMin", "ncclAvg"};
static const size_t k_type_sizes[] = {1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1};

static const char k_remote_text[] = "remote process exited or there was a network error";

/* ---- errors ---- */

static pthread_mutex_t g_error_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_last_error[1024];

/* Records the last error (process-wide, as NCCL's); with NCCL_DEBUG set also prints it. */
static void set_error(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void set_error(const char* fmt, ...) {
  char text[sizeof g_last_error];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(text, sizeof text, fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&g_error_lock);
  memcpy(g_last_error, text, sizeof text);
  pthread_mutex_unlock(&g_error_lock);
  const char* debug = getenv("NCCL_DEBUG");
  if (debug && *debug && strcasecmp(debug, "VERSION") != 0)
    fprintf(stderr, "fake-nccl: %s WARN %s\n", fake_host_name(), text);
}

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return k_remote_text;
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return g_last_error;
}

ncclResult_t ncclGetVersion(int* version) {
  if (version == NULL) return ncclInvalidArgument;
  *version = (int)fake_conf_int((const void*)&ncclGetVersion, "nccl_version", NCCL_VERSION_CODE);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart(void) { return ncclSuccess; }
ncclResult_t ncclGroupEnd(void) { return ncclSuccess; }

/* ---- sockets ---- */

static int write_full(int fd, const void* buf, size_t len) {
  const char* p = buf;
  while (len > 0) {
    ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    p += n;
    len -= (size_t)n;
  }
  return 1;
}

static int read_full(int fd, void* buf, size_t len) {
  char* p = buf;
  while (len > 0) {
    ssize_t n = recv(fd, p, len, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return 0;
    p += n;
    len -= (size_t)n;
  }
  return 1;
}

static void socket_tune(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

static void format_addr(uint32_t addr, uint16_t port, char* out, size_t len) {
  char ip[INET_ADDRSTRLEN] = "?";
  struct in_addr a = {.s_addr = addr};
  inet_ntop(AF_INET, &a, ip, sizeof ip);
  snprintf(out, len, "%s:%u", ip, (unsigned)ntohs(port));
}

/* Does interface `name` match an NCCL_SOCKET_IFNAME list ("eth,ib" prefixes, "=eth0" exact)? */
static int ifname_matches(const char* name, const char* list, int exact) {
  char* copy = strdup(list);
  if (copy == NULL) return 0;
  int match = 0;
  char* save = NULL;
  for (char* e = strtok_r(copy, ",", &save); e && !match; e = strtok_r(NULL, ",", &save))
    match = exact ? strcmp(name, e) == 0 : strncmp(name, e, strlen(e)) == 0;
  free(copy);
  return match;
}

/* The root's address, chosen as NCCL's bootstrap chooses its interface. */
static ncclResult_t pick_address(uint32_t* addr, char* ifname, size_t ifname_len) {
  const char* env = getenv("NCCL_SOCKET_IFNAME");
  const char* list = "docker,lo"; /* NCCL's default: exclude docker* and lo */
  int exclude = 1, exact = 0;
  if (env && *env) {
    list = env;
    exclude = list[0] == '^';
    if (exclude) ++list;
  }
  if (list[0] == '=') exact = 1, ++list;
  struct ifaddrs* all = NULL;
  if (getifaddrs(&all) != 0) {
    set_error("Bootstrap : getifaddrs failed: %s", strerror(errno));
    return ncclSystemError;
  }
  int found = 0;
  for (struct ifaddrs* i = all; i && !found; i = i->ifa_next) {
    if (i->ifa_addr == NULL || i->ifa_addr->sa_family != AF_INET || !(i->ifa_flags & IFF_UP)) continue;
    int match = ifname_matches(i->ifa_name, list, exact);
    if (exclude ? (match || (i->ifa_flags & IFF_LOOPBACK)) : !match) continue;
    *addr = ((struct sockaddr_in*)i->ifa_addr)->sin_addr.s_addr;
    snprintf(ifname, ifname_len, "%s", i->ifa_name);
    found = 1;
  }
  freeifaddrs(all);
  if (found) return ncclSuccess;
  if (env && *env) {
    set_error("Bootstrap : no socket interface found (NCCL_SOCKET_IFNAME=%s matches no up IPv4 interface)",
              env);
    return ncclInvalidUsage;
  }
  *addr = htonl(INADDR_LOOPBACK);
  snprintf(ifname, ifname_len, "lo");
  return ncclSuccess;
}

/* ---- reductions ---- */

/* Small floats go through float with round-to-nearest-even. */
static float half_to_float(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e == 0) {
    float f = (float)m * (1.0f / 16777216.0f); /* m * 2^-24, exact */
    memcpy(&u, &f, 4);
    u |= sign;
  } else {
    u = sign | ((e + 112) << 23) | (m << 13);
  }
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t float_to_half(float value) {
  const uint32_t f32_inf = 255u << 23, f16_limit = (127u + 16) << 23;
  const uint32_t denorm_magic_bits = 126u << 23; /* 0.5f: its ulp is half's smallest subnormal */
  uint32_t f;
  memcpy(&f, &value, 4);
  uint32_t sign = f & 0x80000000u;
  f ^= sign;
  uint16_t out;
  if (f >= f16_limit) {
    out = f > f32_inf ? 0x7e00 : 0x7c00;
  } else if (f < (113u << 23)) {
    float x, magic;
    memcpy(&x, &f, 4);
    memcpy(&magic, &denorm_magic_bits, 4);
    x += magic; /* the FPU rounds to nearest even at 2^-24 */
    uint32_t u;
    memcpy(&u, &x, 4);
    out = (uint16_t)(u - denorm_magic_bits);
  } else {
    uint32_t odd = (f >> 13) & 1u;
    f += (uint32_t)(15 - 127) * (1u << 23) + 0xfffu + odd;
    out = (uint16_t)(f >> 13);
  }
  return (uint16_t)(out | (sign >> 16));
}

static float bf16_to_float(uint16_t b) {
  uint32_t u = (uint32_t)b << 16;
  float f;
  memcpy(&f, &u, 4);
  return f;
}

static uint16_t float_to_bf16(float value) {
  uint32_t u;
  memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* FP8 as cuda_fp8.h converts it (__NV_SATFINITE): e4m3 has no infinity (S.1111.111 is NaN),
 * e5m2 is IEEE-like; out-of-range values saturate to the largest finite. */
static float fp8_to_float(uint8_t v, int e5m2) {
  int mbits = e5m2 ? 2 : 3, ebits = e5m2 ? 5 : 4, bias = e5m2 ? 15 : 7;
  unsigned e = (v >> mbits) & ((1u << ebits) - 1), m = v & ((1u << mbits) - 1);
  float r;
  if (e5m2 && e == 31)
    r = m ? NAN : INFINITY;
  else if (!e5m2 && e == 15 && m == 7)
    r = NAN;
  else if (e == 0)
    r = ldexpf((float)m, 1 - bias - mbits);
  else
    r = ldexpf((float)(m | (1u << mbits)), (int)e - bias - mbits);
  return (v & 0x80) ? -r : r;
}

static uint8_t float_to_fp8(float f, int e5m2) {
  int mbits = e5m2 ? 2 : 3, bias = e5m2 ? 15 : 7, emin = 1 - bias;
  uint8_t sign = signbit(f) ? 0x80 : 0;
  if (isnan(f)) return (uint8_t)(sign | (e5m2 ? 0x7e : 0x7f));
  double max_finite = e5m2 ? 57344.0 : 448.0;
  uint8_t max_bits = e5m2 ? 0x7b : 0x7e;
  double a = fabs((double)f);
  if (a == 0) return sign;
  int exp2;
  frexp(a, &exp2);
  int e = exp2 - 1 < emin ? emin : exp2 - 1;
  double quantum = ldexp(1.0, e - mbits);
  double r = nearbyint(a / quantum) * quantum;
  if (isinf(a) || r > max_finite) return (uint8_t)(sign | max_bits);
  if (r == 0) return sign;
  frexp(r, &exp2);
  e = exp2 - 1;
  if (e < emin) return (uint8_t)(sign | (unsigned)(r / ldexp(1.0, emin - mbits)));
  unsigned man = (unsigned)((ldexp(r, -e) - 1.0) * (double)(1u << mbits));
  return (uint8_t)(sign | (unsigned)((e + bias) << mbits) | man);
}

static float small_to_float(const void* p, size_t i, int dtype) {
  switch (dtype) {
    case ncclFloat16:
      return half_to_float(((const uint16_t*)p)[i]);
    case ncclBfloat16:
      return bf16_to_float(((const uint16_t*)p)[i]);
    case ncclFloat8e4m3:
      return fp8_to_float(((const uint8_t*)p)[i], 0);
    default:
      return fp8_to_float(((const uint8_t*)p)[i], 1);
  }
}

static void small_from_float(void* p, size_t i, int dtype, float v) {
  switch (dtype) {
    case ncclFloat16:
      ((uint16_t*)p)[i] = float_to_half(v);
      break;
    case ncclBfloat16:
      ((uint16_t*)p)[i] = float_to_bf16(v);
      break;
    case ncclFloat8e4m3:
      ((uint8_t*)p)[i] = float_to_fp8(v, 0);
      break;
    default:
      ((uint8_t*)p)[i] = float_to_fp8(v, 1);
      break;
  }
}

/* Integers wrap as on the GPU (arithmetic in the unsigned type); ncclAvg is the sum divided. */
#define REDUCE_INT(T, UT)                        \
  do {                                           \
    T* a = acc;                                  \
    const T* b = in;                             \
    for (size_t i = 0; i < n; ++i) switch (op) { \
        case ncclProd:                           \
          a[i] = (T)(UT)((UT)a[i] * (UT)b[i]);   \
          break;                                 \
        case ncclMax:                            \
          a[i] = a[i] > b[i] ? a[i] : b[i];      \
          break;                                 \
        case ncclMin:                            \
          a[i] = a[i] < b[i] ? a[i] : b[i];      \
          break;                                 \
        default:                                 \
          a[i] = (T)(UT)((UT)a[i] + (UT)b[i]);   \
          break;                                 \
      }                                          \
  } while (0)
#define REDUCE_FLOAT(T)                          \
  do {                                           \
    T* a = acc;                                  \
    const T* b = in;                             \
    for (size_t i = 0; i < n; ++i) switch (op) { \
        case ncclProd:                           \
          a[i] = a[i] * b[i];                    \
          break;                                 \
        case ncclMax:                            \
          a[i] = a[i] > b[i] ? a[i] : b[i];      \
          break;                                 \
        case ncclMin:                            \
          a[i] = a[i] < b[i] ? a[i] : b[i];      \
          break;                                 \
        default:                                 \
          a[i] = a[i] + b[i];                    \
          break;                                 \
      }                                          \
  } while (0)

/* acc[i] = acc[i] op in[i] */
static void reduce(void* acc, const void* in, size_t n, int dtype, int op) {
  switch (dtype) {
    case ncclInt8:
      REDUCE_INT(int8_t, uint8_t);
      break;
    case ncclUint8:
      REDUCE_INT(uint8_t, unsigned);
      break;
    case ncclInt32:
      REDUCE_INT(int32_t, uint32_t);
      break;
    case ncclUint32:
      REDUCE_INT(uint32_t, uint32_t);
      break;
    case ncclInt64:
      REDUCE_INT(int64_t, uint64_t);
      break;
    case ncclUint64:
      REDUCE_INT(uint64_t, uint64_t);
      break;
    case ncclFloat32:
      REDUCE_FLOAT(float);
      break;
    case ncclFloat64:
      REDUCE_FLOAT(double);
      break;
    default:
      for (size_t i = 0; i < n; ++i) {
        float a = small_to_float(acc, i, dtype), b = small_to_float(in, i, dtype), r;
        switch (op) {
          case ncclProd:
            r = a * b;
            break;
          case ncclMax:
            r = a > b ? a : b;
            break;
          case ncclMin:
            r = a < b ? a : b;
            break;
          default:
            r = a + b;
            break;
        }
        small_from_float(acc, i, dtype, r);
      }
  }
}

#define DIVIDE(T)                                            \
  do {                                                       \
    T* a = acc;                                              \
    for (size_t i = 0; i < n; ++i) a[i] = (T)(a[i] / (T)by); \
  } while (0)

static void divide(void* acc, size_t n, int dtype, int by) {
  switch (dtype) {
    case ncclInt8:
      DIVIDE(int8_t);
      break;
    case ncclUint8:
      DIVIDE(uint8_t);
      break;
    case ncclInt32:
      DIVIDE(int32_t);
      break;
    case ncclUint32:
      DIVIDE(uint32_t);
      break;
    case ncclInt64:
      DIVIDE(int64_t);
      break;
    case ncclUint64:
      DIVIDE(uint64_t);
      break;
    case ncclFloat32:
      DIVIDE(float);
      break;
    case ncclFloat64:
      DIVIDE(double);
      break;
    default:
      for (size_t i = 0; i < n; ++i)
        small_from_float(acc, i, dtype, small_to_float(acc, i, dtype) / (float)by);
  }
}

/* ---- the root ---- */

enum RootState { ROOT_JOINING, ROOT_RUNNING, ROOT_FAILED };

struct Conn {
  struct Root* root;
  int fd; /* -1 once closed; only written to with root->lock held */
  struct Hello hello;
  int joined;  /* counted among the joiners */
  int left;    /* said goodbye (ncclCommDestroy) */
  int arrived; /* contributed to the current operation */
  struct CollHeader header;
  void* data;
};

struct Root {
  struct Root* next; /* g_roots */
  pthread_mutex_t lock;
  pthread_cond_t changed; /* a connection ended */
  int listen_fd;
  int wake[2]; /* written once when joining ends; never read, so poll sees it forever */
  uint64_t nonce;
  char where[64];
  int refs;   /* the accept thread and each connection thread */
  int active; /* connection threads running */
  int closing;
  enum RootState state;
  int nranks;
  int njoined;
  struct Conn** joiners; /* njoined of nranks; after joining, indexed by rank */
  int arrived;
  int departed; /* a rank that said goodbye, or -1 */
  ncclResult_t fail_code;
  char fail_msg[MSG_TEXT];
};

/* The roots living in this process. A rank in the same process must not let its process exit
 * while the root still delivers something to other ranks (see local_root_*). */
static pthread_mutex_t g_roots_lock = PTHREAD_MUTEX_INITIALIZER;
static struct Root* g_roots;

static void root_unref(struct Root* r) {
  pthread_mutex_lock(&g_roots_lock);
  pthread_mutex_lock(&r->lock);
  int last = --r->refs == 0;
  if (last)
    for (struct Root** p = &g_roots; *p; p = &(*p)->next)
      if (*p == r) {
        *p = r->next;
        break;
      }
  pthread_mutex_unlock(&r->lock);
  pthread_mutex_unlock(&g_roots_lock);
  if (!last) return;
  close(r->wake[0]);
  close(r->wake[1]);
  pthread_cond_destroy(&r->changed);
  pthread_mutex_destroy(&r->lock);
  free(r->joiners);
  free(r);
}

static void reply_hello(int fd, ncclResult_t status, const char* msg) {
  struct HelloReply reply = {.magic = WIRE_MAGIC, .status = status};
  snprintf(reply.msg, sizeof reply.msg, "%s", msg);
  write_full(fd, &reply, sizeof reply);
}

/* Sends a failure to every rank still connected; r->lock held. */
static void root_fail(struct Root* r, ncclResult_t code, const char* msg) {
  if (r->state == ROOT_FAILED) return;
  r->state = ROOT_FAILED;
  r->fail_code = code;
  snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
  for (int k = 0; k < r->nranks; ++k) {
    struct Conn* c = r->joiners[k];
    if (c == NULL) continue;
    free(c->data);
    c->data = NULL;
    c->arrived = 0;
    if (c->fd < 0 || c->left) continue;
    struct Reply reply = {.magic = WIRE_MAGIC, .kind = MSG_FAIL, .status = code};
    snprintf(reply.msg, sizeof reply.msg, "%s", msg);
    write_full(c->fd, &reply, sizeof reply);
  }
  r->arrived = 0;
}

/* Joining ends: every joiner gets the verdict. r->lock held. */
static void root_end_joining(struct Root* r, ncclResult_t code, const char* msg) {
  struct Conn** by_rank = code == ncclSuccess ? calloc((size_t)r->nranks, sizeof *by_rank) : NULL;
  if (code == ncclSuccess && by_rank == NULL) {
    code = ncclSystemError;
    msg = "out of memory in the communicator's root";
  }
  for (int i = 0; i < r->njoined; ++i) {
    struct Conn* c = r->joiners[i];
    char own[MSG_TEXT];
    snprintf(own, sizeof own, "%s", msg);
    /* "Duplicate GPU" names the receiving rank first, as each real rank reports it. */
    if (code == ncclInvalidUsage && strncmp(msg, "Duplicate GPU", 13) == 0)
      for (int j = 0; j < r->njoined; ++j) {
        struct Conn* o = r->joiners[j];
        if (o != c && strcmp(o->hello.host_id, c->hello.host_id) == 0 &&
            strcmp(o->hello.bus_id, c->hello.bus_id) == 0) {
          const char* end = strrchr(msg, ' ');
          snprintf(own, sizeof own, "Duplicate GPU detected : rank %d and rank %d both on CUDA device%s",
                   c->hello.rank, o->hello.rank, end ? end : "");
          break;
        }
      }
    reply_hello(c->fd, code, own);
    if (by_rank) by_rank[c->hello.rank] = c;
  }
  if (by_rank) {
    free(r->joiners);
    r->joiners = by_rank;
    r->state = ROOT_RUNNING;
  } else {
    r->state = ROOT_FAILED;
    r->fail_code = code;
    snprintf(r->fail_msg, sizeof r->fail_msg, "%s", msg);
    for (int i = 0; i < r->njoined; ++i) r->joiners[i] = NULL;
  }
  if (write(r->wake[1], "x", 1) < 0) { /* nothing to do: the pipe is only a level */
  }
}

/* NCCL's "%lx" of the bus id: the hex digits of "00000000:18:00.0" read as one number. */
static unsigned long bus_number(const char* bus_id) {
  unsigned long v = 0;
  for (const char* p = bus_id; *p; ++p) {
    int d = *p >= '0' && *p <= '9'                     ? *p - '0'
            : (*p | 0x20) >= 'a' && (*p | 0x20) <= 'f' ? (*p | 0x20) - 'a' + 10
                                                       : -1;
    if (d >= 0) v = v * 16 + (unsigned long)d;
  }
  return v;
}

/* All nranks joined: the checks NCCL's init makes. r->lock held. */
static void root_check_joiners(struct Root* r) {
  char msg[MSG_TEXT];
  for (int i = 0; i < r->njoined; ++i)
    for (int j = i + 1; j < r->njoined; ++j) {
      struct Hello *a = &r->joiners[i]->hello, *b = &r->joiners[j]->hello;
      if (a->rank == b->rank) {
        snprintf(msg, sizeof msg, "rank %d joined twice (host %.64s pid %d and host %.64s pid %d)", a->rank,
                 a->host, a->pid, b->host, b->pid);
        root_end_joining(r, ncclInvalidUsage, msg);
        return;
      }
    }
  for (int i = 0; i < r->njoined; ++i)
    for (int j = i + 1; j < r->njoined; ++j) {
      struct Hello *a = &r->joiners[i]->hello, *b = &r->joiners[j]->hello;
      if (a->rank > b->rank) {
        struct Hello* t = a;
        a = b;
        b = t;
      }
      if (strcmp(a->host_id, b->host_id) == 0 && strcmp(a->bus_id, b->bus_id) == 0) {
        snprintf(msg, sizeof msg, "Duplicate GPU detected : rank %d and rank %d both on CUDA device %lx",
                 a->rank, b->rank, bus_number(a->bus_id));
        root_end_joining(r, ncclInvalidUsage, msg);
        return;
      }
    }
  root_end_joining(r, ncclSuccess, "");
}

static void describe(const struct CollHeader* h, char* out, size_t len) {
  snprintf(out, len, "%s(count %llu, %s", k_coll_names[h->coll], (unsigned long long)h->count,
           k_type_names[h->dtype]);
  size_t used = strlen(out);
  if (h->coll == COLL_ALLREDUCE || h->coll == COLL_REDUCESCATTER)
    snprintf(out + used, len - used, ", %s)", k_op_names[h->op]);
  else if (h->coll == COLL_BROADCAST)
    snprintf(out + used, len - used, ", root %d)", h->root);
  else
    snprintf(out + used, len - used, ")");
}

static int headers_agree(const struct CollHeader* a, const struct CollHeader* b) {
  if (a->seq != b->seq || a->coll != b->coll || a->dtype != b->dtype || a->count != b->count) return 0;
  if ((a->coll == COLL_ALLREDUCE || a->coll == COLL_REDUCESCATTER) && a->op != b->op) return 0;
  return a->coll != COLL_BROADCAST || a->root == b->root;
}

static void send_result(struct Conn* c, uint64_t seq, const void* data, size_t bytes) {
  if (c->fd < 0) return;
  struct Reply reply = {.magic = WIRE_MAGIC, .kind = MSG_RESULT, .seq = seq, .bytes = bytes};
  /* A failed write means the rank is gone; its connection thread reports that. */
  if (write_full(c->fd, &reply, sizeof reply) && bytes > 0) write_full(c->fd, data, bytes);
}

/* Every rank's contribution arrived: check, compute, answer. r->lock held. */
static void root_run_collective(struct Root* r) {
  struct Conn** m = r->joiners;
  const struct CollHeader* h = &m[0]->header;
  for (int k = 1; k < r->nranks; ++k)
    if (!headers_agree(h, &m[k]->header)) {
      char a[160], b[160], msg[MSG_TEXT];
      describe(h, a, sizeof a);
      describe(&m[k]->header, b, sizeof b);
      snprintf(msg, sizeof msg,
               "collective mismatch at operation %llu: rank 0 called %.70s but rank %d called %.70s",
               (unsigned long long)h->seq, a, k, b);
      root_fail(r, ncclInvalidUsage, msg);
      return;
    }
  size_t es = k_type_sizes[h->dtype], n = (size_t)h->count, nr = (size_t)r->nranks;
  uint64_t seq = h->seq;
  switch (h->coll) {
    case COLL_BROADCAST:
      for (int k = 0; k < r->nranks; ++k) send_result(m[k], seq, m[h->root]->data, n * es);
      break;
    case COLL_ALLGATHER: {
      char* all = malloc(nr * n * es);
      if (all == NULL) {
        root_fail(r, ncclSystemError, "out of memory in the communicator's root");
        return;
      }
      for (int k = 0; k < r->nranks; ++k) memcpy(all + (size_t)k * n * es, m[k]->data, n * es);
      for (int k = 0; k < r->nranks; ++k) send_result(m[k], seq, all, nr * n * es);
      free(all);
      break;
    }
    default: { /* all-reduce and reduce-scatter: reduce in rank order into rank 0's data */
      size_t total = h->coll == COLL_ALLREDUCE ? n : nr * n;
      for (int k = 1; k < r->nranks; ++k) reduce(m[0]->data, m[k]->data, total, h->dtype, h->op);
      if (h->op == ncclAvg) divide(m[0]->data, total, h->dtype, r->nranks);
      const char* acc = m[0]->data;
      for (int k = 0; k < r->nranks; ++k)
        if (h->coll == COLL_ALLREDUCE)
          send_result(m[k], seq, acc, n * es);
        else
          send_result(m[k], seq, acc + (size_t)k * n * es, n * es);
    }
  }
  for (int k = 0; k < r->nranks; ++k) {
    free(m[k]->data);
    m[k]->data = NULL;
    m[k]->arrived = 0;
  }
  r->arrived = 0;
}

/* Joining: wait until joining ends, dropping out if this rank's connection closes first. */
static void conn_wait_joining(struct Conn* c) {
  struct Root* r = c->root;
  while (r->state == ROOT_JOINING) {
    pthread_mutex_unlock(&r->lock);
    struct pollfd fds[2] = {{.fd = c->fd, .events = POLLIN}, {.fd = r->wake[0], .events = POLLIN}};
    int n = poll(fds, 2, -1);
    int gone = 0;
    if (n > 0 && fds[0].revents != 0) {
      /* A rank sends nothing before its init reply: readable means closed (or a broken peer). */
      char byte;
      ssize_t k = recv(c->fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      gone = k >= 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
    }
    pthread_mutex_lock(&r->lock);
    if (gone && r->state == ROOT_JOINING) {
      /* The rank gave up (died) before everyone joined: forget it, as if it never came. */
      for (int i = 0; i < r->njoined; ++i)
        if (r->joiners[i] == c) {
          r->joiners[i] = r->joiners[--r->njoined];
          break;
        }
      c->joined = 0;
      return;
    }
  }
}

static void conn_lost(struct Conn* c) {
  struct Root* r = c->root;
  if (r->state != ROOT_RUNNING) return;
  char msg[MSG_TEXT];
  snprintf(msg, sizeof msg, "%s (rank %d on host %s, pid %d, closed its connection)", k_remote_text,
           c->hello.rank, c->hello.host, c->hello.pid);
  root_fail(r, ncclRemoteError, msg);
}

static void conn_run(struct Conn* c) {
  struct Root* r = c->root;
  for (;;) {
    struct CollHeader h;
    if (!read_full(c->fd, &h, sizeof h) || h.magic != WIRE_MAGIC) {
      pthread_mutex_lock(&r->lock);
      conn_lost(c);
      pthread_mutex_unlock(&r->lock);
      return;
    }
    if (h.kind == MSG_BYE) {
      pthread_mutex_lock(&r->lock);
      c->left = 1;
      if (r->departed < 0) r->departed = c->hello.rank;
      if (r->state == ROOT_RUNNING && r->arrived > 0) {
        char msg[MSG_TEXT];
        snprintf(msg, sizeof msg,
                 "%s (rank %d destroyed its communicator while others waited in a collective)", k_remote_text,
                 c->hello.rank);
        root_fail(r, ncclRemoteError, msg);
      }
      pthread_mutex_unlock(&r->lock);
      return;
    }
    int valid = h.kind == MSG_COLL && h.coll >= 0 && h.coll <= COLL_REDUCESCATTER && h.dtype >= 0 &&
                h.dtype < ncclNumTypes && h.op >= 0 && h.op < ncclNumOps;
    void* data = valid && h.bytes > 0 ? malloc(h.bytes) : NULL;
    if (!valid || (h.bytes > 0 && (data == NULL || !read_full(c->fd, data, h.bytes)))) {
      free(data);
      pthread_mutex_lock(&r->lock);
      conn_lost(c);
      pthread_mutex_unlock(&r->lock);
      return;
    }
    pthread_mutex_lock(&r->lock);
    if (r->state != ROOT_RUNNING) {
      free(data); /* failed: drain until the rank closes */
    } else {
      c->header = h;
      c->data = data;
      c->arrived = 1;
      r->arrived++;
      if (r->departed >= 0) {
        char msg[MSG_TEXT];
        snprintf(msg, sizeof msg, "%s (rank %d destroyed its communicator; operation %llu cannot complete)",
                 k_remote_text, r->departed, (unsigned long long)h.seq);
        root_fail(r, ncclRemoteError, msg);
      } else if (r->arrived == r->nranks) {
        root_run_collective(r);
      }
    }
    pthread_mutex_unlock(&r->lock);
  }
}

static void* conn_main(void* arg) {
  struct Conn* c = arg;
  struct Root* r = c->root;
  struct Hello* h = &c->hello;
  if (!read_full(c->fd, h, sizeof *h) || h->magic != WIRE_MAGIC || h->version != WIRE_VERSION) goto out;
  h->host[sizeof h->host - 1] = h->host_id[sizeof h->host_id - 1] = h->bus_id[sizeof h->bus_id - 1] = 0;
  if (h->nonce != r->nonce) {
    char msg[MSG_TEXT];
    snprintf(msg, sizeof msg,
             "unique id does not match the communicator whose root listens at %s (stale or corrupt id?)",
             r->where);
    reply_hello(c->fd, ncclInvalidArgument, msg);
    goto out;
  }
  pthread_mutex_lock(&r->lock);
  if (r->state != ROOT_JOINING) {
    char msg[MSG_TEXT];
    if (r->state == ROOT_FAILED)
      snprintf(msg, sizeof msg, "%s", r->fail_msg);
    else
      snprintf(msg, sizeof msg, "rank %d joined after all %d ranks of the communicator had joined", h->rank,
               r->nranks);
    reply_hello(c->fd, r->state == ROOT_FAILED ? r->fail_code : ncclInvalidUsage, msg);
    pthread_mutex_unlock(&r->lock);
    goto out;
  }
  if (r->nranks == 0) {
    r->joiners = h->nranks > 0 ? calloc((size_t)h->nranks, sizeof *r->joiners) : NULL;
    if (r->joiners == NULL) {
      reply_hello(c->fd, ncclSystemError, "out of memory in the communicator's root");
      pthread_mutex_unlock(&r->lock);
      goto out;
    }
    r->nranks = h->nranks;
  }
  r->joiners[r->njoined++] = c;
  c->joined = 1;
  if (h->nranks != r->nranks) {
    char msg[MSG_TEXT];
    snprintf(msg, sizeof msg, "rank %d was initialised with nranks %d but rank %d with nranks %d", h->rank,
             h->nranks, r->joiners[0]->hello.rank, r->nranks);
    root_end_joining(r, ncclInvalidUsage, msg);
  } else if (h->rank < 0 || h->rank >= r->nranks) {
    char msg[MSG_TEXT];
    snprintf(msg, sizeof msg, "Invalid rank requested : %d/%d", h->rank, r->nranks);
    root_end_joining(r, ncclInvalidArgument, msg);
  } else if (r->njoined == r->nranks) {
    root_check_joiners(r);
  }
  conn_wait_joining(c);
  int running = c->joined && r->state == ROOT_RUNNING;
  pthread_mutex_unlock(&r->lock);
  if (running) conn_run(c);
out:
  pthread_mutex_lock(&r->lock);
  if (c->fd >= 0) close(c->fd);
  c->fd = -1;
  free(c->data);
  c->data = NULL;
  int in_table = r->state == ROOT_RUNNING || r->state == ROOT_FAILED;
  if (in_table && r->joiners)
    for (int k = 0; k < r->nranks; ++k)
      if (r->joiners[k] == c) r->joiners[k] = NULL;
  pthread_cond_broadcast(&r->changed);
  /* When the last rank is gone (or joining failed), stop listening: later ranks are refused. */
  if (--r->active == 0 && r->state != ROOT_JOINING && !r->closing) {
    r->closing = 1;
    shutdown(r->listen_fd, SHUT_RDWR);
  }
  pthread_mutex_unlock(&r->lock);
  free(c);
  root_unref(r);
  return NULL;
}

static void* accept_main(void* arg) {
  struct Root* r = arg;
  for (;;) {
    int fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        struct timespec pause = {0, 100 * 1000 * 1000};
        nanosleep(&pause, NULL); /* out of descriptors: don't spin */
        continue;
      }
      break; /* shut down */
    }
    socket_tune(fd);
    pthread_mutex_lock(&r->lock);
    int closing = r->closing;
    struct Conn* c = closing ? NULL : calloc(1, sizeof *c);
    if (c == NULL) {
      pthread_mutex_unlock(&r->lock);
      close(fd);
      if (closing) break;
      continue;
    }
    c->root = r;
    c->fd = fd;
    r->refs++;
    r->active++;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_t thread;
    if (pthread_create(&thread, &attr, conn_main, c) != 0) {
      r->refs--;
      r->active--;
      close(fd);
      free(c);
    }
    pthread_attr_destroy(&attr);
    pthread_mutex_unlock(&r->lock);
  }
  close(r->listen_fd);
  root_unref(r);
  return NULL;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  if (uniqueId == NULL) {
    set_error("ncclGetUniqueId : uniqueId argument is NULL");
    return ncclInvalidArgument;
  }
  uint32_t addr = 0;
  char ifname[IF_NAMESIZE + 1];
  ncclResult_t res = pick_address(&addr, ifname, sizeof ifname);
  if (res != ncclSuccess) return res;
  struct Root* r = calloc(1, sizeof *r);
  if (r == NULL) {
    set_error("ncclGetUniqueId : out of memory");
    return ncclSystemError;
  }
  r->departed = -1;
  r->wake[0] = r->wake[1] = -1;
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = addr, .sin_port = 0};
  socklen_t salen = sizeof sa;
  r->listen_fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (r->listen_fd < 0 || bind(r->listen_fd, (struct sockaddr*)&sa, sizeof sa) != 0 ||
      listen(r->listen_fd, 512) != 0 || getsockname(r->listen_fd, (struct sockaddr*)&sa, &salen) != 0 ||
      pipe2(r->wake, O_CLOEXEC) != 0) {
    set_error("Bootstrap : cannot listen on %s: %s", ifname, strerror(errno));
    if (r->listen_fd >= 0) close(r->listen_fd);
    if (r->wake[0] >= 0) close(r->wake[0]);
    if (r->wake[1] >= 0) close(r->wake[1]);
    free(r);
    return ncclSystemError;
  }
  if (getrandom(&r->nonce, sizeof r->nonce, 0) != (ssize_t)sizeof r->nonce)
    r->nonce = ((uint64_t)time(NULL) << 32) ^ (uint64_t)getpid() ^ (uint64_t)(uintptr_t)r;
  format_addr(addr, sa.sin_port, r->where, sizeof r->where);
  pthread_mutex_init(&r->lock, NULL);
  pthread_cond_init(&r->changed, NULL);
  r->refs = 1;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  int rc = pthread_create(&thread, &attr, accept_main, r);
  pthread_attr_destroy(&attr);
  if (rc != 0) {
    set_error("ncclGetUniqueId : cannot start the root thread: %s", strerror(rc));
    close(r->listen_fd);
    close(r->wake[0]);
    close(r->wake[1]);
    pthread_cond_destroy(&r->changed);
    pthread_mutex_destroy(&r->lock);
    free(r);
    return ncclSystemError;
  }
  pthread_mutex_lock(&g_roots_lock);
  r->next = g_roots;
  g_roots = r;
  pthread_mutex_unlock(&g_roots_lock);
  struct FakeId id;
  memset(&id, 0, sizeof id);
  memcpy(id.magic, k_id_magic, sizeof id.magic);
  id.version = WIRE_VERSION;
  id.addr = addr;
  id.port = sa.sin_port;
  id.pid = (uint32_t)getpid();
  id.nonce = r->nonce;
  snprintf(id.host, sizeof id.host, "%s", fake_host_name());
  memcpy(uniqueId->internal, &id, sizeof id);
  return ncclSuccess;
}

/* The root of `id` if it lives in this process (with a reference), else NULL. */
static struct Root* local_root_find(const struct FakeId* id) {
  if (id->pid != (uint32_t)getpid()) return NULL;
  pthread_mutex_lock(&g_roots_lock);
  struct Root* r = g_roots;
  while (r && r->nonce != id->nonce) r = r->next;
  if (r) {
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
  }
  pthread_mutex_unlock(&g_roots_lock);
  return r;
}

/* Init got its verdict: wait until the root has sent it to every rank (it sends all of them under
 * its lock), so that this process may exit right away without cutting the others off. */
static void local_root_verdict_sent(struct Root* r) {
  pthread_mutex_lock(&r->lock);
  pthread_mutex_unlock(&r->lock);
}

/* This rank closed its connection: wait until the root has dealt with it (a goodbye, or a failure
 * sent to the other ranks) and with anything it was sending at the time. */
static void local_root_wait_departure(struct Root* r, int rank) {
  pthread_mutex_lock(&r->lock);
  while (r->state != ROOT_JOINING && r->joiners && rank < r->nranks && r->joiners[rank] != NULL)
    pthread_cond_wait(&r->changed, &r->lock);
  pthread_mutex_unlock(&r->lock);
}

/* ---- communicators ---- */

struct Op;

struct ncclComm {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_mutex_t send_lock; /* one writer on the socket at a time */
  int refs;                  /* the handle and each queued operation */
  int rank, nranks, device;
  int fd;
  char root_where[64];
  uint64_t next_seq; /* last operation enqueued */
  uint64_t exec_seq; /* last operation finished on its stream */
  uint64_t inject_at;
  ncclResult_t async;
  int aborted;
  int root_lost; /* the root's connection closed while idle: the next operation fails */
  int delivering;
  struct Op* waiting;
  pthread_t reader;
  struct Root* local_root; /* the root, when it lives in this process */
};

struct Op {
  ncclComm_t comm;
  uint64_t seq;
  struct CollHeader header;
  const void* send;
  size_t send_bytes;
  void* recv;
  size_t recv_bytes;
  void* result; /* the root's answer, read by the comm's reader; copied to recv on the stream */
  int done;
};

static void comm_unref(ncclComm_t c) {
  pthread_mutex_lock(&c->lock);
  int last = --c->refs == 0;
  pthread_mutex_unlock(&c->lock);
  if (!last) return;
  close(c->fd);
  if (c->local_root) root_unref(c->local_root);
  pthread_mutex_destroy(&c->lock);
  pthread_mutex_destroy(&c->send_lock);
  pthread_cond_destroy(&c->cond);
  free(c);
}

/* First error wins. c->lock held. */
static void comm_set_async(ncclComm_t c, ncclResult_t code, const char* msg) {
  if (c->async != ncclSuccess) return;
  c->async = code;
  set_error("%s", msg);
  pthread_cond_broadcast(&c->cond);
}

static void* reader_main(void* arg) {
  ncclComm_t c = arg;
  for (;;) {
    struct Reply reply;
    if (!read_full(c->fd, &reply, sizeof reply) || reply.magic != WIRE_MAGIC) break;
    reply.msg[sizeof reply.msg - 1] = 0;
    pthread_mutex_lock(&c->lock);
    if (reply.kind == MSG_FAIL) {
      comm_set_async(c, (ncclResult_t)reply.status, reply.msg);
      pthread_mutex_unlock(&c->lock);
      continue;
    }
    struct Op* op = c->waiting;
    if (c->aborted || reply.kind != MSG_RESULT || op == NULL || op->seq != reply.seq ||
        op->recv_bytes != reply.bytes) {
      if (!c->aborted) comm_set_async(c, ncclInternalError, "fake-nccl: unexpected message from the root");
      pthread_mutex_unlock(&c->lock);
      break;
    }
    /* Into a buffer of our own: recvbuff may be sendbuff, which the stream's thread is sending
     * (the copy happens there, ordered by c->lock). */
    c->delivering = 1;
    pthread_mutex_unlock(&c->lock);
    void* result = reply.bytes ? malloc(reply.bytes) : NULL;
    int ok = reply.bytes == 0 || (result != NULL && read_full(c->fd, result, reply.bytes));
    pthread_mutex_lock(&c->lock);
    c->delivering = 0;
    if (ok) {
      op->result = result;
      op->done = 1;
      c->waiting = NULL; /* idle from now on, even before the stream's thread wakes */
    } else {
      free(result);
      if (result == NULL && !c->aborted)
        comm_set_async(c, ncclSystemError, "fake-nccl: out of memory for a result");
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (!ok) break;
  }
  pthread_mutex_lock(&c->lock);
  if (!c->aborted && c->async == ncclSuccess) {
    char msg[MSG_TEXT];
    snprintf(msg, sizeof msg, "%s (lost the connection to the communicator's root at %s)", k_remote_text,
             c->root_where);
    /* Idle, a lost root is noticed by the next operation, as NCCL notices a dead peer on use. */
    if (c->waiting)
      comm_set_async(c, ncclRemoteError, msg);
    else
      c->root_lost = 1;
  }
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  return NULL;
}

/* The host function of every collective, run in order on the stream's thread. */
static void run_op(void* arg) {
  struct Op* op = arg;
  ncclComm_t c = op->comm;
  pthread_mutex_lock(&c->lock);
  while (!c->aborted && c->exec_seq + 1 != op->seq) pthread_cond_wait(&c->cond, &c->lock);
  if (!c->aborted && c->async == ncclSuccess && op->seq == c->inject_at)
    comm_set_async(c, ncclSystemError, "injected async error (fake-gpus.conf)");
  if (!c->aborted && c->async == ncclSuccess && c->root_lost) {
    char msg[MSG_TEXT];
    snprintf(msg, sizeof msg, "%s (lost the connection to the communicator's root at %s)", k_remote_text,
             c->root_where);
    comm_set_async(c, ncclRemoteError, msg);
  }
  if (!c->aborted && c->async == ncclSuccess) {
    c->waiting = op;
    pthread_mutex_unlock(&c->lock);
    pthread_mutex_lock(&c->send_lock);
    int sent = write_full(c->fd, &op->header, sizeof op->header) &&
               (op->send_bytes == 0 || write_full(c->fd, op->send, op->send_bytes));
    pthread_mutex_unlock(&c->send_lock);
    pthread_mutex_lock(&c->lock);
    if (!sent && !c->aborted) {
      char msg[MSG_TEXT];
      snprintf(msg, sizeof msg, "%s (cannot send to the communicator's root at %s)", k_remote_text,
               c->root_where);
      comm_set_async(c, ncclRemoteError, msg);
    }
  }
  /* After an error the operation never completes; only ncclCommAbort lets the stream go on. */
  while (!op->done && !(c->aborted && !c->delivering)) pthread_cond_wait(&c->cond, &c->lock);
  if (c->waiting == op) c->waiting = NULL;
  if (op->done && op->recv_bytes > 0) {
    pthread_mutex_unlock(&c->lock);
    memcpy(op->recv, op->result, op->recv_bytes);
    pthread_mutex_lock(&c->lock);
  }
  free(op->result);
  c->exec_seq = op->seq;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  free(op);
  comm_unref(c);
}

/* NCCL_HOSTID, else host name + boot id + network namespace: ranks on one machine share all three,
 * "hosts" of the test cluster (network namespaces, maybe with one name) differ. */
static void host_identity(char* out, size_t len) {
  const char* env = getenv("NCCL_HOSTID");
  if (env && *env) {
    snprintf(out, len, "%s", env);
    return;
  }
  char boot[64] = "", netns[64] = "";
  FILE* f = fopen("/proc/sys/kernel/random/boot_id", "r");
  if (f) {
    if (fgets(boot, sizeof boot, f) == NULL) boot[0] = 0;
    boot[strcspn(boot, "\n")] = 0;
    fclose(f);
  }
  ssize_t n = readlink("/proc/self/ns/net", netns, sizeof netns - 1);
  netns[n > 0 ? n : 0] = 0;
  snprintf(out, len, "%s|%s|%s", fake_host_name(), boot, netns);
}

/* Connects to the root, retrying a refused or unreachable address for a bounded time. */
static int connect_root(const struct FakeId* id, char* why, size_t why_len) {
  long tries = 20, sleep_ms = 100;
  const char* env = getenv("NCCL_SOCKET_RETRY_CNT");
  if (env && atol(env) > 0) tries = atol(env);
  env = getenv("NCCL_SOCKET_RETRY_SLEEP_MSEC");
  if (env && atol(env) > 0) sleep_ms = atol(env);
  struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = id->addr, .sin_port = id->port};
  for (long attempt = 0;; ++attempt) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) {
      snprintf(why, why_len, "socket: %s", strerror(errno));
      return -1;
    }
    int err = 0;
    if (connect(fd, (struct sockaddr*)&sa, sizeof sa) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        struct pollfd p = {.fd = fd, .events = POLLOUT};
        int n;
        do n = poll(&p, 1, 5000);
        while (n < 0 && errno == EINTR);
        socklen_t elen = sizeof err;
        if (n == 0)
          err = ETIMEDOUT;
        else if (n < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) != 0)
          err = errno;
      }
    }
    if (err == 0) {
      int flags = fcntl(fd, F_GETFL);
      fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
      socket_tune(fd);
      return fd;
    }
    close(fd);
    snprintf(why, why_len, "%s", strerror(err));
    if (attempt + 1 >= tries) return -1;
    struct timespec pause = {sleep_ms / 1000, (sleep_ms % 1000) * 1000000L};
    nanosleep(&pause, NULL);
  }
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  if (comm == NULL) {
    set_error("ncclCommInitRank : comm argument is NULL");
    return ncclInvalidArgument;
  }
  *comm = NULL;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    set_error("Invalid rank requested : %d/%d", rank, nranks);
    return ncclInvalidArgument;
  }
  int device = 0, ndev = 0;
  cudaError_t ce = cudaGetDevice(&device);
  if (ce == cudaSuccess) ce = cudaGetDeviceCount(&ndev);
  struct Hello hello = {.magic = WIRE_MAGIC,
                        .version = WIRE_VERSION,
                        .nranks = nranks,
                        .rank = rank,
                        .pid = (int32_t)getpid(),
                        .device = device};
  if (ce == cudaSuccess) ce = cudaDeviceGetPCIBusId(hello.bus_id, sizeof hello.bus_id, device);
  if (ce != cudaSuccess) {
    set_error("Cuda failure %d '%s'", (int)ce, cudaGetErrorString(ce));
    return ncclUnhandledCudaError;
  }
  struct FakeId id;
  memcpy(&id, commId.internal, sizeof id);
  if (memcmp(id.magic, k_id_magic, sizeof id.magic) != 0 || id.version != WIRE_VERSION) {
    set_error("ncclCommInitRank : unique id is invalid (not made by ncclGetUniqueId of this library)");
    return ncclInvalidArgument;
  }
  id.host[sizeof id.host - 1] = 0;
  char where[64], why[128];
  format_addr(id.addr, id.port, where, sizeof where);
  hello.nonce = id.nonce;
  snprintf(hello.host, sizeof hello.host, "%s", fake_host_name());
  host_identity(hello.host_id, sizeof hello.host_id);
  int fd = connect_root(&id, why, sizeof why);
  if (fd < 0) {
    set_error(
        "Bootstrap : cannot connect to the root of the communicator at %s (unique id of host %s, pid %u): %s",
        where, id.host, id.pid, why);
    return ncclSystemError;
  }
  struct HelloReply reply;
  if (!write_full(fd, &hello, sizeof hello) || !read_full(fd, &reply, sizeof reply) ||
      reply.magic != WIRE_MAGIC) {
    close(fd);
    set_error("%s (lost the connection to the communicator's root at %s during init)", k_remote_text, where);
    return ncclRemoteError;
  }
  reply.msg[sizeof reply.msg - 1] = 0;
  struct Root* local = local_root_find(&id);
  if (local) local_root_verdict_sent(local);
  if (reply.status != ncclSuccess) {
    if (local) root_unref(local);
    close(fd);
    set_error("%s", reply.msg);
    return (ncclResult_t)reply.status;
  }
  ncclComm_t c = calloc(1, sizeof *c);
  if (c == NULL) {
    if (local) root_unref(local);
    close(fd);
    set_error("ncclCommInitRank : out of memory");
    return ncclSystemError;
  }
  c->local_root = local;
  pthread_mutex_init(&c->lock, NULL);
  pthread_mutex_init(&c->send_lock, NULL);
  pthread_cond_init(&c->cond, NULL);
  c->refs = 1;
  c->rank = rank;
  c->nranks = nranks;
  c->device = device;
  c->fd = fd;
  snprintf(c->root_where, sizeof c->root_where, "%s", where);
  long error_rank = fake_conf_int((const void*)&ncclCommInitRank, "async_error_rank", -1);
  long error_after = fake_conf_int((const void*)&ncclCommInitRank, "async_error_after", -1);
  if (error_rank == rank && error_after >= 0) c->inject_at = (uint64_t)error_after + 1;
  int rc = pthread_create(&c->reader, NULL, reader_main, c);
  if (rc != 0) {
    set_error("ncclCommInitRank : cannot start a thread: %s", strerror(rc));
    comm_unref(c);
    return ncclSystemError;
  }
  *comm = c;
  return ncclSuccess;
}

/* Stops everything of this communicator and drops the handle's reference. */
static void comm_close(ncclComm_t c) {
  pthread_mutex_lock(&c->lock);
  c->aborted = 1;
  pthread_cond_broadcast(&c->cond);
  pthread_mutex_unlock(&c->lock);
  shutdown(c->fd, SHUT_RDWR);
  pthread_join(c->reader, NULL);
  if (c->local_root) local_root_wait_departure(c->local_root, c->rank);
  comm_unref(c);
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  comm_close(comm);
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  if (comm == NULL) {
    set_error("ncclCommFinalize : comm argument is NULL");
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/* Waits for the queued operations (as NCCL's finalize does), says goodbye, frees. A failed
 * communicator is torn down at once, as by ncclCommAbort. */
ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == NULL) return ncclSuccess;
  ncclComm_t c = comm;
  pthread_mutex_lock(&c->lock);
  while (c->async == ncclSuccess && !c->root_lost && c->exec_seq < c->next_seq)
    pthread_cond_wait(&c->cond, &c->lock);
  int clean = c->async == ncclSuccess && !c->root_lost;
  pthread_mutex_unlock(&c->lock);
  if (clean) {
    struct CollHeader bye = {.magic = WIRE_MAGIC, .kind = MSG_BYE};
    pthread_mutex_lock(&c->send_lock);
    write_full(c->fd, &bye, sizeof bye);
    pthread_mutex_unlock(&c->send_lock);
  }
  comm_close(c);
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  if (comm == NULL || asyncError == NULL) {
    set_error("ncclCommGetAsyncError : %s argument is NULL", comm == NULL ? "comm" : "asyncError");
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&comm->lock);
  *asyncError = comm->async;
  pthread_mutex_unlock(&comm->lock);
  return ncclSuccess;
}

static ncclResult_t comm_int(ncclComm_t comm, int* out, int value, const char* fn) {
  if (comm == NULL || out == NULL) {
    set_error("%s : %s argument is NULL", fn, comm == NULL ? "comm" : "output");
    return ncclInvalidArgument;
  }
  *out = value;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return comm_int(comm, count, comm ? comm->nranks : 0, "ncclCommCount");
}
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return comm_int(comm, rank, comm ? comm->rank : 0, "ncclCommUserRank");
}
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return comm_int(comm, device, comm ? comm->device : 0, "ncclCommCuDevice");
}

/* ---- collectives ---- */

static ncclResult_t enqueue(enum Coll coll, const void* send, void* recv, size_t count, ncclDataType_t dtype,
                            ncclRedOp_t redop, int root, ncclComm_t comm, cudaStream_t stream) {
  const char* name = k_coll_names[coll];
  if (comm == NULL) {
    set_error("%s : comm argument is NULL", name);
    return ncclInvalidArgument;
  }
  pthread_mutex_lock(&comm->lock);
  ncclResult_t async = comm->async;
  pthread_mutex_unlock(&comm->lock);
  if (async != ncclSuccess) {
    /* As NCCL's ncclCommEnsureReady: a failed communicator refuses new work with its error. The
     * last error keeps saying why it failed. */
    return async;
  }
  if ((unsigned)dtype >= (unsigned)ncclNumTypes) {
    set_error("%s : invalid type %d", name, (int)dtype);
    return ncclInvalidArgument;
  }
  int reducing = coll == COLL_ALLREDUCE || coll == COLL_REDUCESCATTER;
  if (reducing && (unsigned)redop >= (unsigned)ncclNumOps) {
    set_error("%s : invalid reduction operation %d", name, (int)redop);
    return ncclInvalidArgument;
  }
  if (coll == COLL_BROADCAST && (root < 0 || root >= comm->nranks)) {
    set_error("%s : invalid root %d (root should be in the 0..%d range)", name, root, comm->nranks);
    return ncclInvalidArgument;
  }
  if (count == 0) return ncclSuccess; /* NCCL discards empty collectives */
  int needs_send = coll != COLL_BROADCAST || root == comm->rank;
  if (recv == NULL || (needs_send && send == NULL)) {
    set_error("%s : %s argument is NULL", name, recv == NULL ? "recvbuff" : "sendbuff");
    return ncclInvalidArgument;
  }
  size_t es = k_type_sizes[dtype], nr = (size_t)comm->nranks;
  if (count > SIZE_MAX / es / nr) {
    set_error("%s : count %zu is too large", name, count);
    return ncclInvalidArgument;
  }
  struct Op* op = calloc(1, sizeof *op);
  if (op == NULL) {
    set_error("%s : out of memory", name);
    return ncclSystemError;
  }
  op->comm = comm;
  op->send = send;
  op->recv = recv;
  switch (coll) {
    case COLL_ALLREDUCE:
      op->send_bytes = op->recv_bytes = count * es;
      break;
    case COLL_BROADCAST:
      op->send_bytes = needs_send ? count * es : 0;
      op->recv_bytes = count * es;
      break;
    case COLL_ALLGATHER:
      op->send_bytes = count * es;
      op->recv_bytes = nr * count * es;
      break;
    case COLL_REDUCESCATTER:
      op->send_bytes = nr * count * es;
      op->recv_bytes = count * es;
      break;
  }
  op->header = (struct CollHeader){.magic = WIRE_MAGIC,
                                   .kind = MSG_COLL,
                                   .coll = coll,
                                   .dtype = dtype,
                                   .op = reducing ? (int32_t)redop : 0,
                                   .root = coll == COLL_BROADCAST ? root : 0,
                                   .count = count,
                                   .bytes = op->send_bytes};
  /* The sequence number and the stream position are taken together, so operations keep their order. */
  pthread_mutex_lock(&comm->lock);
  op->seq = op->header.seq = comm->next_seq + 1;
  cudaError_t ce = cudaLaunchHostFunc(stream, run_op, op);
  if (ce == cudaSuccess) {
    comm->next_seq++;
    comm->refs++;
  }
  pthread_mutex_unlock(&comm->lock);
  if (ce != cudaSuccess) {
    free(op);
    set_error("%s : Cuda failure %d '%s'", name, (int)ce, cudaGetErrorString(ce));
    return ncclUnhandledCudaError;
  }
  return ncclSuccess;
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(COLL_ALLREDUCE, sendbuff, recvbuff, count, datatype, op, 0, comm, stream);
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream) {
  return enqueue(COLL_BROADCAST, sendbuff, recvbuff, count, datatype, ncclSum, root, comm, stream);
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream) {
  return enqueue(COLL_ALLGATHER, sendbuff, recvbuff, sendcount, datatype, ncclSum, 0, comm, stream);
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return enqueue(COLL_REDUCESCATTER, sendbuff, recvbuff, recvcount, datatype, op, 0, comm, stream);
}
