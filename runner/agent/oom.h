// Whether the kernel killed a process for memory: the evidence behind "out of memory" in a
// failure (never a guess from SIGKILL alone, which anyone may send). Libc only: part of the agent.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string_view>

namespace mltrain::agent {

// The oom_kill counter of `pid`'s cgroup (v2 memory.events, else v1 memory.oom_control), or
// nullopt when it cannot be read without root.
std::optional<uint64_t> cgroup_oom_kills(pid_t pid);

// What the kernel log says of `pid` since `since_us` (CLOCK_MONOTONIC microseconds, as kmsg
// stamps records; an older record is of an earlier process with the same pid): true when it
// records an OOM kill of it, false when the log was read and says nothing, nullopt when /dev/kmsg
// cannot be read (kernel.dmesg_restrict).
std::optional<bool> kmsg_oom_killed(pid_t pid, uint64_t since_us);
// CLOCK_MONOTONIC now, in microseconds: a rank's start for kmsg_oom_killed.
uint64_t monotonic_us();

// The agent's verdict for a rank that died of SIGKILL: the kernel log when it can be read, else the
// cgroup counter having grown since the rank started (`kills_at_start`, nullopt: unknown).
bool oom_killed(pid_t pid, uint64_t started_us, std::optional<uint64_t> kills_at_start);

namespace detail {
// "oom_kill 3" in memory.events (or memory.oom_control) text; nullopt when absent.
std::optional<uint64_t> parse_oom_kill_count(std::string_view events);
// Whether one /dev/kmsg record ("6,1234,5678,-;Out of memory: Killed process 42 (python3) ...",
// or "oom-kill:...,task=python3,pid=42,uid=1000") records an OOM kill of `pid`.
bool kmsg_record_kills(std::string_view record, pid_t pid, uint64_t since_us = 0);
// The cgroup v2 path ("0::/user.slice/x") in /proc/PID/cgroup text, or "" (v1 only).
std::string_view cgroup_v2_path(std::string_view proc_cgroup);
}  // namespace detail

}  // namespace mltrain::agent
