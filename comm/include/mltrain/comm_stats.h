/* Per-rank counters the comm library keeps in shared memory, so the launcher's agent can tell
 * which rank the others wait for (`mltrain top`) without asking the rank anything.
 *
 * Where: the name in MLTRAIN_COMM_STATS_NAME, which the mltrain agent gives each rank it starts
 * (/mltrain-<run id>-stats-<rank>-<16 random hex digits>: another user on the host cannot guess it,
 * so cannot take it first); without one, /mltrain-<run id>-stats-<rank> (the run id as in every
 * segment of the job: characters other than [A-Za-z0-9._-] as '_', at most 100). Created by init
 * when MLTRAIN_RUN_ID is set and MLTRAIN_COMM_STATS is not 0, exclusively (O_EXCL) and mode 0600;
 * a block of this user's own already there (an earlier gang's) is replaced, anyone else's is left
 * alone and the rank goes without counters (said once on stderr). Removed when the communicator
 * is destroyed, and by the agent with the job's other segments.
 * Who: one writer (the rank); readers map it read-only and load each 64-bit field atomically
 * (__atomic_load_n, relaxed). Fields may be a call apart from each other; no lock is taken.
 * Readers trust no block blindly: /dev/shm is everyone's. The agent reads a block only if it is a
 * regular file owned by its own user, writable by nobody else, whose pid is one of its ranks and
 * whose fields are in range; it reads the clock with a bounded number of tries
 * (mltrain_comm_stats_try_read_clock). Anything else it ignores, naming the file once.
 * Times: in ticks of the block's clock, so that a collective pays for cheap clock reads and no
 * arithmetic (on x86-64 the TSC, where the kernel keeps time with it; else CLOCK_MONOTONIC ns,
 * clock_scale 2^32). The fields keep their _ns names for source compatibility: convert them with
 * mltrain_comm_stats_time_ns (started_ns, entered_ns, last_exit_ns) and
 * mltrain_comm_stats_span_ns (comm_ns) under a clock read by mltrain_comm_stats_read_clock, which
 * gives CLOCK_MONOTONIC ns (comparable across the processes of one host) within a millisecond:
 * the rank measures the scale against CLOCK_MONOTONIC again about once a second.
 * Sampling: every call is timed, except in a tight loop of short calls (64 timed calls in a row,
 * each ending less than 5 us after the one before), where one call in 16 at random is, and its
 * time also stands for the untimed calls since the last timed one (capped at the time that
 * passed); the first timed call that finds more time passed ends it. There comm_ns is right on
 * average and a few calls behind, except that a long wait in the untimed calls right after a
 * pause in such a loop goes uncounted; last_exit_ns is the last timed call's exit; an untimed
 * open call shows entered_ns = that exit (open since then at the latest). calls and bytes count
 * every call.
 * Reading: over an interval, comm share = d(comm_ns) / d(wall) (plus now - entered_ns while a
 * collective is open). Every rank of a collective leaves it together, so the ranks that arrive
 * early spend the difference inside it: the rank with the lowest share is the one the others
 * wait for. */
#ifndef MLTRAIN_COMM_STATS_H
#define MLTRAIN_COMM_STATS_H

#include <stdint.h>

#define MLTRAIN_COMM_STATS_MAGIC 0x5453544du /* "MSTT" little-endian */
#define MLTRAIN_COMM_STATS_VERSION 2u        /* 2: times in ticks, with the clock_* fields */

struct mltrain_comm_stats {
  /* Written at init, and the clock about once a second: the first cache line. */
  uint32_t magic;   /* MLTRAIN_COMM_STATS_MAGIC, written last at init */
  uint32_t version; /* MLTRAIN_COMM_STATS_VERSION */
  int32_t rank, world_size;
  int32_t pid;
  uint32_t backend;     /* 0: CPU backend, 1: NCCL */
  uint64_t clock_seq;   /* odd while the rank rewrites the three below (a seqlock) */
  uint64_t clock_ticks; /* a tick count ... */
  uint64_t clock_ns;    /* ... and CLOCK_MONOTONIC ns at the same moment */
  uint64_t clock_scale; /* ns per tick x 2^32, at most 2^32 */
  uint64_t started_ns;  /* ticks: when init finished */
  /* Written by every collective: the second cache line. */
  uint64_t calls;        /* collectives finished (failed ones too) */
  uint64_t bytes;        /* their payload: count x element size */
  uint64_t comm_ns;      /* ticks inside finished collectives (see Sampling) */
  uint64_t entered_ns;   /* ticks: when the open collective began; 0: none open */
  uint64_t last_exit_ns; /* ticks: when the last (timed) one ended */
};

/* A consistent copy of a block's clock. */
struct mltrain_comm_stats_clock {
  uint64_t ticks, ns, scale;
};

/* How many times a reader tries for a consistent copy of the clock before it gives up for this
 * sample. The rank rewrites the clock in well under a microsecond; a clock_seq that stays odd (a
 * rank stopped mid-update, or a block that is not a live rank's) must not hold a reader. */
#define MLTRAIN_COMM_STATS_CLOCK_TRIES 1024u

/* Copies the block's clock into *out: 1 when a consistent copy came within
 * MLTRAIN_COMM_STATS_CLOCK_TRIES reads with clock_scale <= 2^32 (as a rank writes it), else 0 and
 * *out untouched (give up for this sample). Never blocks. */
static inline int mltrain_comm_stats_try_read_clock(const struct mltrain_comm_stats* s,
                                                    struct mltrain_comm_stats_clock* out) {
  unsigned tries;
  for (tries = 0; tries < MLTRAIN_COMM_STATS_CLOCK_TRIES; ++tries) {
    struct mltrain_comm_stats_clock c;
    const uint64_t seq = __atomic_load_n(&s->clock_seq, __ATOMIC_ACQUIRE);
    if ((seq & 1u) != 0) continue;
    c.ticks = __atomic_load_n(&s->clock_ticks, __ATOMIC_RELAXED);
    c.ns = __atomic_load_n(&s->clock_ns, __ATOMIC_RELAXED);
    c.scale = __atomic_load_n(&s->clock_scale, __ATOMIC_RELAXED);
    __atomic_thread_fence(__ATOMIC_ACQUIRE);
    if (seq != __atomic_load_n(&s->clock_seq, __ATOMIC_RELAXED)) continue;
    if (c.scale > (UINT64_C(1) << 32)) return 0;
    *out = c;
    return 1;
  }
  return 0;
}

/* As mltrain_comm_stats_try_read_clock; when no consistent copy comes, a clock of all zeros
 * (scale 0: every time and span reads as 0 or the clock's ns). Kept for source compatibility;
 * new readers use the try_ form and skip the sample. */
static inline struct mltrain_comm_stats_clock mltrain_comm_stats_read_clock(
    const struct mltrain_comm_stats* s) {
  struct mltrain_comm_stats_clock c = {0, 0, 0};
  (void)mltrain_comm_stats_try_read_clock(s, &c);
  return c;
}

/* ns in `ticks` ticks (a duration: comm_ns) */
static inline uint64_t mltrain_comm_stats_span_ns(const struct mltrain_comm_stats_clock* c, uint64_t ticks) {
  /* (ticks * scale) >> 32 without 128-bit arithmetic; exact, as scale <= 2^32 */
  return (ticks >> 32) * c->scale + (((ticks & 0xffffffffu) * c->scale) >> 32);
}

/* CLOCK_MONOTONIC ns at tick count `ticks` (a time: started_ns, entered_ns, last_exit_ns); 0 (none
 * open, none yet) stays 0 */
static inline uint64_t mltrain_comm_stats_time_ns(const struct mltrain_comm_stats_clock* c, uint64_t ticks) {
  if (ticks == 0) return 0;
  return ticks >= c->ticks ? c->ns + mltrain_comm_stats_span_ns(c, ticks - c->ticks)
                           : c->ns - mltrain_comm_stats_span_ns(c, c->ticks - ticks);
}

#endif
