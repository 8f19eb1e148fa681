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

#ifdef __cplusplus
}
#endif
#endif
