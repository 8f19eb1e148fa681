/* Per-rank counters the comm library keeps in shared memory, so the launcher's agent can tell
 * which rank the others wait for (`mltrain top`) without asking the rank anything.
 *
 * Where: /dev/shm/mltrain-<run id>-stats-<rank> (the run id as in every segment of the job:
 * characters other than [A-Za-z0-9._-] as '_', at most 100), created by init when MLTRAIN_RUN_ID is
 * set and MLTRAIN_COMM_STATS is not 0; removed when the communicator is destroyed, and by the
 * agent with the job's other segments.
 * Who: one writer (the rank); readers map it read-only and load each 64-bit field atomically
 * (__atomic_load_n, relaxed). Fields may be a call apart from each other; no lock is taken.
 * Times: CLOCK_MONOTONIC nanoseconds (comparable across the processes of one host).
 * Reading: over an interval, comm share = d(comm_ns) / d(wall) (plus now - entered_ns while a
 * collective is open). Every rank of a collective leaves it together, so the ranks that arrive
 * early spend the difference inside it: the rank with the lowest share is the one the others
 * wait for. */
#ifndef MLTRAIN_COMM_STATS_H
#define MLTRAIN_COMM_STATS_H

#include <stdint.h>

#define MLTRAIN_COMM_STATS_MAGIC 0x5453544du /* "MSTT" little-endian */
#define MLTRAIN_COMM_STATS_VERSION 1u

struct mltrain_comm_stats {
  uint32_t magic;   /* MLTRAIN_COMM_STATS_MAGIC, written last at init */
  uint32_t version; /* MLTRAIN_COMM_STATS_VERSION */
  int32_t rank, world_size;
  int32_t pid;
  uint32_t backend;      /* 0: CPU backend, 1: NCCL */
  uint64_t started_ns;   /* when init finished */
  uint64_t calls;        /* collectives finished (failed ones too) */
  uint64_t bytes;        /* their payload: count x element size */
  uint64_t comm_ns;      /* time inside finished collectives */
  uint64_t entered_ns;   /* when the open collective began; 0: none open */
  uint64_t last_exit_ns; /* when the last one ended */
};

#endif
