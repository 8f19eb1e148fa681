// Leases on a host's shared things (its GPUs, the whole host, a place in its queue), held by the
// kernel: a lease is a listening socket bound to a name in the host's abstract unix namespace
// ("@mltrain-lease/gpu/GPU-…"). The kernel lets one socket hold a name and frees it when the
// socket's last holder exits however it ends (SIGKILL too), so a crash can never leak a lease; no
// file is involved, so no user of the host can remove, replace or break another's, and every user
// sees every lease (/proc/net/unix) with its holder's uid and pid as the kernel gives them
// (SO_PEERCRED). The holder answers each connection with a line saying who and what it is.
//
// The namespace is the host's network namespace: one per machine, as the GPUs are, and one per
// test-cluster host. libc and the standard library only: the agent compiles this.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::lease {

// Where leases live: every job of one space sees and contends for the same names. Jobs use the
// default; tests give each test a space of its own (MLTRAIN_LEASE_SPACE), so tests that run at
// once on one machine never contend for its (fake) GPUs.
struct Space {
  std::string name;  // "" for the default; else [a-z0-9-], at most 32
  std::string prefix() const { return name.empty() ? "mltrain-lease/" : "mltrain-lease-" + name + "/"; }
};
// Whether `name` may name a space.
bool valid_space(std::string_view name);

// What a lease says of its holder: text fields, one "key=value" line each on the wire, escaped
// and bounded by whoever shows them (a holder may be a stranger).
using Info = std::map<std::string, std::string>;

// The longest name a lease may have (an abstract socket name is at most 107 bytes).
inline constexpr size_t kMaxName = 96;
// What a reader takes of a holder's answer.
inline constexpr size_t kMaxInfoBytes = 2048;

// Names: "gpu/<uuid>", "exclusive", "job/<run id>", "queue/<order key>". A name holds only
// [A-Za-z0-9._:/-]; anything else is refused (returns false).
bool valid_name(std::string_view name);

// One held lease. Movable, not copyable; released when destroyed (or when the process ends).
class Lease {
 public:
  Lease(Lease&& o) noexcept;
  Lease& operator=(Lease&& o) noexcept;
  Lease(const Lease&) = delete;
  Lease& operator=(const Lease&) = delete;
  ~Lease();

  const std::string& name() const { return name_; }
  // Readable when a reader is waiting for the answer: poll it and call answer() then.
  int fd() const { return fd_; }
  // Answers every reader waiting now with the info (never blocks; a reader that does not read
  // loses its answer).
  void answer();
  void set_info(Info info);

 private:
  friend std::optional<Lease> take(const Space& space, std::string_view name, Info info, std::string* error);
  Lease(int fd, std::string name, Info info);
  int fd_ = -1;
  std::string name_;
  std::string answer_;  // the encoded info
};

// Takes the lease `name` on this host. nullopt when someone holds it (error stays empty) or when
// it cannot be taken (error says why: a bad name, no sockets).
std::optional<Lease> take(const Space& space, std::string_view name, Info info, std::string* error);

// A lease as a reader sees it.
struct Seen {
  std::string name;
  uid_t uid = uid_t(-1);  // the holder, as the kernel says; -1 when it could not be asked
  pid_t pid = 0;
  Info info;  // what the holder answered; empty when it did not answer in time
  bool answered = false;
  // Why the holder is no mltrain agent of a live run, as far as this host can tell (empty: it may
  // be one). Any local user can bind any name, so a holder proves what the kernel can vouch for:
  // its process lives, is the uid's, is named as the agent is, and did not claim the lease (or a
  // queue place) since before it started. A doubted holder is a squatter: named, never obeyed.
  std::string doubt;
};

// What /proc says of a lease holder's process (read by holders(); a seam for the unit tests).
struct ProcFacts {
  bool alive = false;
  uid_t uid = uid_t(-1);
  std::string comm;       // its name as the kernel keeps it (15 bytes at most)
  int64_t started_s = 0;  // its start, in seconds since the epoch (0: unknown)
  bool hidden = false;    // /proc hides other users' processes (hidepid): nothing can be told
  std::string argv0;      // the first word of its command line
};
ProcFacts proc_facts(pid_t pid);

// The doubt of a holder seen as `seen` whose process is `facts` (Seen::doubt).
std::string doubt_of(const Seen& seen, const ProcFacts& facts);

// How far a holder's "since" (the launcher's clock) may lie before its process's start (the host's
// clock) and still be believed: a laptop's clock may be wrong by hours, a queued job's ticket is
// dated when its launcher started (before the agent that holds it), and wrongly doubting a real
// holder would let two jobs share a GPU. A day: a place dated 1970, or a lease held "for 499073h",
// is no job's.
inline constexpr int64_t kClockSkewS = 86400;

// Every lease on this host whose name starts with `prefix` ("" for all; "gpu/" for the GPUs),
// sorted by name, each with its holder asked within `timeout` (all asked at once).
// At most `max` leases are looked at (a host may hold any number of names). Names in `skip` (the
// caller's own: asking itself would cost the whole timeout) are left out.
std::vector<Seen> list(const Space& space, std::string_view prefix, std::chrono::milliseconds timeout,
                       size_t max = 4096, const std::vector<std::string>& skip = {});

// The holders of these leases, asked all at once within `timeout`; a name nobody holds is left out.
std::vector<Seen> holders(const Space& space, const std::vector<std::string>& names,
                          std::chrono::milliseconds timeout);

// The holder of one lease; nullopt when nobody holds it.
std::optional<Seen> holder(const Space& space, std::string_view name, std::chrono::milliseconds timeout);

// The info's wire form and back (bounded: kMaxInfoBytes, 32 fields; a field that is not
// key=value, or a key outside [a-z_], is dropped).
std::string encode(const Info& info);
Info decode(std::string_view text);

namespace detail {
// The names under the space's prefix and then `prefix` in /proc/net/unix text (listening sockets
// only), in order of appearance, at most `max`.
std::vector<std::string> names_in_proc_net_unix(std::string_view text, const Space& space,
                                                std::string_view prefix, size_t max);
}  // namespace detail

}  // namespace mltrain::lease
