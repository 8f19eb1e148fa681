/* C API of libmltrain-comm, for C programs and Python ctypes.
 * Every function returns 0 on success or a positive MLTRAIN_COMM_E* code; the message of the
 * last failure on this thread is mltrain_comm_last_error(). Semantics as in mltrain/comm.hpp. */
#ifndef MLTRAIN_COMM_H
#define MLTRAIN_COMM_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mltrain_comm mltrain_comm_t;

enum mltrain_dtype {
  MLTRAIN_F32 = 0,
  MLTRAIN_F64 = 1,
  MLTRAIN_F16 = 2,
  MLTRAIN_BF16 = 3,
  MLTRAIN_I32 = 4,
  MLTRAIN_I64 = 5,
  MLTRAIN_U8 = 6
};
enum mltrain_redop { MLTRAIN_SUM = 0, MLTRAIN_PROD = 1, MLTRAIN_MIN = 2, MLTRAIN_MAX = 3, MLTRAIN_AVG = 4 };
enum mltrain_comm_status {
  MLTRAIN_COMM_OK = 0,
  MLTRAIN_COMM_EUSAGE = 1,
  MLTRAIN_COMM_ESTORE = 2,
  MLTRAIN_COMM_ETIMEOUT = 3,
  MLTRAIN_COMM_EPEER = 4,
  MLTRAIN_COMM_EMISMATCH = 5,
  MLTRAIN_COMM_EINTERNAL = 6
};

int mltrain_comm_init_from_env(mltrain_comm_t** out);
int mltrain_comm_destroy(mltrain_comm_t* comm); /* NULL is fine */
int mltrain_comm_rank(const mltrain_comm_t* comm);
int mltrain_comm_size(const mltrain_comm_t* comm);
int mltrain_comm_allreduce(mltrain_comm_t* comm, const void* send, void* recv, size_t count, int dtype,
                           int op);
/* Communicator::allreduce_shared: *result gets where the reduced elements are (a shared region
 * valid until the next call with this key or mltrain_comm_release_shared, or buf itself). */
int mltrain_comm_allreduce_shared(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int op,
                                  unsigned long long key, const void** result);
/* The same, with buf lying at byte `offset` of the shared file open as fd (Communicator's
 * SharedFile): ranks on one host read it where it lies. fd < 0: as mltrain_comm_allreduce_shared. */
int mltrain_comm_allreduce_shared_file(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int op,
                                       unsigned long long key, int fd, size_t offset, const void** result);
/* Communicator::allreduce_mapped: buf reduced in place, lying at byte `offset` of the shared file
 * open as fd on every rank; ranks on one host read and write each other's buffers there. */
int mltrain_comm_allreduce_mapped(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int op,
                                  unsigned long long key, int fd, size_t offset);
int mltrain_comm_release_shared(mltrain_comm_t* comm, unsigned long long key);
int mltrain_comm_broadcast(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int root);
int mltrain_comm_allgather(mltrain_comm_t* comm, const void* send, void* recv, size_t count, int dtype);
int mltrain_comm_reduce_scatter(mltrain_comm_t* comm, const void* send, void* recv, size_t recv_count,
                                int dtype, int op);
int mltrain_comm_barrier(mltrain_comm_t* comm);
/* The backend device buffers use: 1 NCCL, 0 the CPU backend (which refuses them), -1 for NULL;
 * why, in one line (valid while comm lives). */
int mltrain_comm_backend(const mltrain_comm_t* comm);
const char* mltrain_comm_backend_reason(const mltrain_comm_t* comm);
/* NCCL backend: the cudaStream_t device collectives are enqueued on (NULL: the legacy default
 * stream); calls still return when the work is done. */
int mltrain_comm_set_cuda_stream(mltrain_comm_t* comm, void* stream);
const char* mltrain_comm_last_error(void);

/* Parameter-server mode (semantics as in mltrain/ps.hpp). One client per process, thread-safe.
 * A buffer passed to an async call must stay valid until mltrain_ps_wait() on its handle, which
 * waits, frees the handle and returns the request's status. */
typedef struct mltrain_ps mltrain_ps_t;
typedef struct mltrain_ps_handle mltrain_ps_handle_t;
int mltrain_ps_init_from_env(mltrain_ps_t** out);
int mltrain_ps_destroy(mltrain_ps_t* ps); /* NULL is fine */
int mltrain_ps_worker(const mltrain_ps_t* ps);
int mltrain_ps_num_workers(const mltrain_ps_t* ps);
int mltrain_ps_num_servers(const mltrain_ps_t* ps);
int mltrain_ps_is_sync(const mltrain_ps_t* ps);
int mltrain_ps_declare(mltrain_ps_t* ps, unsigned long long key, size_t count, int dtype, const void* init);
int mltrain_ps_push(mltrain_ps_t* ps, unsigned long long key, const void* buf);
int mltrain_ps_pull(mltrain_ps_t* ps, unsigned long long key, void* buf);
int mltrain_ps_push_pull(mltrain_ps_t* ps, unsigned long long key, const void* send, void* recv);
int mltrain_ps_push_async(mltrain_ps_t* ps, unsigned long long key, const void* buf,
                          mltrain_ps_handle_t** out);
int mltrain_ps_pull_async(mltrain_ps_t* ps, unsigned long long key, void* buf, mltrain_ps_handle_t** out);
int mltrain_ps_push_pull_async(mltrain_ps_t* ps, unsigned long long key, const void* send, void* recv,
                               mltrain_ps_handle_t** out);
int mltrain_ps_done(const mltrain_ps_handle_t* handle); /* 1 when finished (wait will not block) */
int mltrain_ps_wait(mltrain_ps_handle_t* handle);

#ifdef __cplusplus
}
#endif
#endif
