// The C API: a thin shell over the C++ one; errors become codes plus a thread-local message.
#include <string>

#include "mltrain/comm.h"
#include "mltrain/comm.hpp"
#include "mltrain/ps.hpp"

struct mltrain_comm {
  std::unique_ptr<mltrain::comm::Communicator> impl;
};
struct mltrain_ps {
  std::unique_ptr<mltrain::comm::ps::Client> impl;
};
struct mltrain_ps_handle {
  mltrain::comm::ps::Handle handle;
};

namespace {

thread_local std::string last_error;

int code_of(mltrain::comm::Error::Kind kind) {
  using K = mltrain::comm::Error::Kind;
  switch (kind) {
    case K::usage:
      return MLTRAIN_COMM_EUSAGE;
    case K::store:
      return MLTRAIN_COMM_ESTORE;
    case K::timeout:
      return MLTRAIN_COMM_ETIMEOUT;
    case K::peer_closed:
      return MLTRAIN_COMM_EPEER;
    case K::mismatch:
      return MLTRAIN_COMM_EMISMATCH;
    case K::internal:
      return MLTRAIN_COMM_EINTERNAL;
  }
  return MLTRAIN_COMM_EINTERNAL;
}

template <class F>
int catching(F&& f) {
  try {
    f();
    return MLTRAIN_COMM_OK;
  } catch (const mltrain::comm::Error& e) {
    last_error = e.what();
    return code_of(e.kind());
  } catch (const std::exception& e) {  // e.g. bad_alloc: must not cross the C boundary
    last_error = std::string("mltrain-comm: ") + e.what();
    return MLTRAIN_COMM_EINTERNAL;
  }
}

template <class F>
int guarded_ps(mltrain_ps_t* ps, F&& f) {
  if (ps == nullptr || !ps->impl) {
    last_error = "mltrain-comm: null PS client";
    return MLTRAIN_COMM_EUSAGE;
  }
  return catching([&] { f(*ps->impl); });
}

// Starts an async request; *out gets its handle.
template <class F>
int started(mltrain_ps_t* ps, mltrain_ps_handle_t** out, F&& f) {
  if (out == nullptr) {
    last_error = "mltrain-comm: null handle pointer";
    return MLTRAIN_COMM_EUSAGE;
  }
  *out = nullptr;
  return guarded_ps(ps, [&](auto& c) { *out = new mltrain_ps_handle{f(c)}; });
}

template <class F>
int guarded(mltrain_comm_t* comm, F&& f) {
  if (comm == nullptr || !comm->impl) {
    last_error = "mltrain-comm: null communicator";
    return MLTRAIN_COMM_EUSAGE;
  }
  return catching([&] { f(*comm->impl); });
}

mltrain::comm::DataType dt(int v) { return static_cast<mltrain::comm::DataType>(v); }
mltrain::comm::ReduceOp op(int v) { return static_cast<mltrain::comm::ReduceOp>(v); }

}  // namespace

extern "C" {

int mltrain_comm_init_from_env(mltrain_comm_t** out) {
  if (out == nullptr) {
    last_error = "mltrain-comm: null output pointer";
    return MLTRAIN_COMM_EUSAGE;
  }
  *out = nullptr;
  return catching([&] { *out = new mltrain_comm{mltrain::comm::Communicator::init_from_env()}; });
}

int mltrain_comm_destroy(mltrain_comm_t* comm) {
  delete comm;
  return MLTRAIN_COMM_OK;
}

int mltrain_comm_rank(const mltrain_comm_t* comm) {
  return comm != nullptr && comm->impl ? comm->impl->rank() : -1;
}

int mltrain_comm_size(const mltrain_comm_t* comm) {
  return comm != nullptr && comm->impl ? comm->impl->size() : -1;
}

int mltrain_comm_allreduce(mltrain_comm_t* comm, const void* send, void* recv, size_t count, int dtype,
                           int redop) {
  return guarded(comm, [&](auto& c) { c.allreduce(send, recv, count, dt(dtype), op(redop)); });
}

int mltrain_comm_allreduce_shared(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int redop,
                                  unsigned long long key, const void** result) {
  return mltrain_comm_allreduce_shared_file(comm, buf, count, dtype, redop, key, -1, 0, result);
}

int mltrain_comm_allreduce_shared_file(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int redop,
                                       unsigned long long key, int fd, size_t offset, const void** result) {
  return guarded(comm, [&](auto& c) {
    const mltrain::comm::SharedFile file{fd, offset};
    const void* at = c.allreduce_shared(buf, count, dt(dtype), op(redop), key, fd >= 0 ? &file : nullptr);
    if (result != nullptr) *result = at;
  });
}

int mltrain_comm_allreduce_mapped(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int redop,
                                  unsigned long long key, int fd, size_t offset) {
  return guarded(comm, [&](auto& c) {
    c.allreduce_mapped(buf, count, dt(dtype), op(redop), key, mltrain::comm::SharedFile{fd, offset});
  });
}

int mltrain_comm_release_shared(mltrain_comm_t* comm, unsigned long long key) {
  return guarded(comm, [&](auto& c) { c.release_shared(key); });
}

int mltrain_comm_broadcast(mltrain_comm_t* comm, void* buf, size_t count, int dtype, int root) {
  return guarded(comm, [&](auto& c) { c.broadcast(buf, count, dt(dtype), root); });
}

int mltrain_comm_allgather(mltrain_comm_t* comm, const void* send, void* recv, size_t count, int dtype) {
  return guarded(comm, [&](auto& c) { c.allgather(send, recv, count, dt(dtype)); });
}

int mltrain_comm_reduce_scatter(mltrain_comm_t* comm, const void* send, void* recv, size_t recv_count,
                                int dtype, int redop) {
  return guarded(comm, [&](auto& c) { c.reduce_scatter(send, recv, recv_count, dt(dtype), op(redop)); });
}

int mltrain_comm_barrier(mltrain_comm_t* comm) {
  return guarded(comm, [&](auto& c) { c.barrier(); });
}

int mltrain_comm_backend(const mltrain_comm_t* comm) {
  if (comm == nullptr || !comm->impl) return -1;
  return comm->impl->backend() == mltrain::comm::Backend::nccl ? 1 : 0;
}

const char* mltrain_comm_backend_reason(const mltrain_comm_t* comm) {
  return comm != nullptr && comm->impl ? comm->impl->backend_reason().c_str() : "";
}

int mltrain_comm_set_cuda_stream(mltrain_comm_t* comm, void* stream) {
  return guarded(comm, [&](auto& c) { c.set_cuda_stream(stream); });
}

const char* mltrain_comm_last_error(void) { return last_error.c_str(); }

int mltrain_ps_init_from_env(mltrain_ps_t** out) {
  if (out == nullptr) {
    last_error = "mltrain-comm: null output pointer";
    return MLTRAIN_COMM_EUSAGE;
  }
  *out = nullptr;
  return catching([&] { *out = new mltrain_ps{mltrain::comm::ps::Client::init_from_env()}; });
}

int mltrain_ps_destroy(mltrain_ps_t* ps) {
  delete ps;
  return MLTRAIN_COMM_OK;
}

int mltrain_ps_worker(const mltrain_ps_t* ps) { return ps && ps->impl ? ps->impl->worker() : -1; }
int mltrain_ps_num_workers(const mltrain_ps_t* ps) { return ps && ps->impl ? ps->impl->num_workers() : -1; }
int mltrain_ps_num_servers(const mltrain_ps_t* ps) { return ps && ps->impl ? ps->impl->num_servers() : -1; }
int mltrain_ps_is_sync(const mltrain_ps_t* ps) { return ps && ps->impl ? (ps->impl->sync() ? 1 : 0) : -1; }

int mltrain_ps_declare(mltrain_ps_t* ps, unsigned long long key, size_t count, int dtype, const void* init) {
  return guarded_ps(ps, [&](auto& c) { c.declare(key, count, dt(dtype), init); });
}
int mltrain_ps_push(mltrain_ps_t* ps, unsigned long long key, const void* buf) {
  return guarded_ps(ps, [&](auto& c) { c.push(key, buf); });
}
int mltrain_ps_pull(mltrain_ps_t* ps, unsigned long long key, void* buf) {
  return guarded_ps(ps, [&](auto& c) { c.pull(key, buf); });
}
int mltrain_ps_push_pull(mltrain_ps_t* ps, unsigned long long key, const void* send, void* recv) {
  return guarded_ps(ps, [&](auto& c) { c.push_pull(key, send, recv); });
}
int mltrain_ps_push_async(mltrain_ps_t* ps, unsigned long long key, const void* buf,
                          mltrain_ps_handle_t** out) {
  return started(ps, out, [&](auto& c) { return c.push_async(key, buf); });
}
int mltrain_ps_pull_async(mltrain_ps_t* ps, unsigned long long key, void* buf, mltrain_ps_handle_t** out) {
  return started(ps, out, [&](auto& c) { return c.pull_async(key, buf); });
}
int mltrain_ps_push_pull_async(mltrain_ps_t* ps, unsigned long long key, const void* send, void* recv,
                               mltrain_ps_handle_t** out) {
  return started(ps, out, [&](auto& c) { return c.push_pull_async(key, send, recv); });
}
int mltrain_ps_done(const mltrain_ps_handle_t* handle) {
  return handle == nullptr || handle->handle.done() ? 1 : 0;
}
int mltrain_ps_wait(mltrain_ps_handle_t* handle) {
  if (handle == nullptr) return MLTRAIN_COMM_OK;
  std::unique_ptr<mltrain_ps_handle_t> owned(handle);
  return catching([&] { owned->handle.wait(); });
}

}  // extern "C"
