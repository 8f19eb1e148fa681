// Hostfiles and host lists: the formats of DeepSpeed, Open MPI, Horovod and Slurm.
// Depends only on runner/common (its "did you mean"). Every parse error throws hostfile::ParseError.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace mltrain::hostfile {

// What a host is for in a parameter-server job (`role=` on a hostfile line): a worker runs ranks,
// a server runs parameter servers and no rank, both does both. Outside PS mode servers are unused.
enum class Role { worker, server, both };

// "worker", "server" or "both".
const char* role_name(Role r);

struct Host {
  std::string name;           // host name, alias or address as written; IPv6 without brackets
  std::string user;           // from "user@host", empty when not given
  int port = 0;               // explicit SSH port, 0 when not given
  int slots = 0;              // processes to place there, 0 when not given
  int max_slots = 0;          // upper bound (Open MPI), 0 when not given
  std::vector<int> slot_ids;  // slot indices left after include/exclude; empty means 0..slots-1
  std::string origin;         // "file:line" or "-H" where this host was written
  Role role = Role::worker;   // role=worker|server|both, worker when not given
};

// A malformed hostfile line, host list item or filter. what() is one line:
//   "hosts.txt:3:7: bad slot count 'x' in 'gpu1 slots=x' (expected a positive integer)"
class ParseError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Parses a hostfile. Each non-blank, non-comment line is one host in any of these forms:
//   host slots=4 [max_slots=8]      DeepSpeed / Open MPI
//   host:4                          Horovod
//   user@host[:4]  [::1]:4  ssh://user@host:2222 slots=4  host port=2222 slots=4
//   host slots=4 role=server        role=worker|server|both (parameter-server jobs)
// `#` starts a comment. A host written twice is an error. `filename` is used in messages.
std::vector<Host> parse_hostfile(std::string_view text, std::string_view filename);
std::vector<Host> load_hostfile(const std::string& path);  // reads the file, then parse_hostfile

// Parses a comma-separated list such as "-H a:2,user@b:4,[fe80::1]:2,gpu[01-03]:8".
// Items may use Slurm bracket ranges. `origin` names where the list came from ("-H", "job.toml:7").
std::vector<Host> parse_host_list(std::string_view list, std::string_view origin);

// DeepSpeed-style filters: "host1:0,2@host2" keeps slots 0 and 2 of host1 and all of host2.
// At most one of include/exclude may be non-empty. A filter that names an unknown host or slot
// is an error (with a "did you mean" suggestion for host names). Hosts left with no slot are dropped.
std::vector<Host> apply_filters(std::vector<Host> hosts, std::string_view include, std::string_view exclude);

// Expands a Slurm node list: "gpu[01-04,07],cpu1" -> gpu01 gpu02 gpu03 gpu04 gpu07 cpu1.
std::vector<std::string> expand_nodelist(std::string_view nodelist);

// Number of slots a host contributes: slot_ids.size() when filtered, else slots (or 1 if unset).
int slot_count(const Host& h);

}  // namespace mltrain::hostfile
