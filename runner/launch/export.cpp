// `mltrain export`: a job spec as a Kubernetes manifest (docs/k8s.md), a Volcano Job or a Kubeflow
// PyTorchJob. The YAML is written by hand: every string double-quoted and escaped, keys in a fixed
// order, so the same spec always gives the same bytes.
#include <fnmatch.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "runner/common/error.h"
#include "runner/common/secret.h"
#include "runner/common/text.h"
#include "runner/launch/detail/launch_detail.h"
#include "runner/launch/launch.h"

namespace mltrain::launch {
namespace {

namespace fs = std::filesystem;

// ---- a small YAML writer: maps, lists, strings, integers, booleans; block style ----

class Yaml {
 public:
  enum class Kind { string, integer, boolean, map, list };

  static Yaml str(std::string v) {
    Yaml y(Kind::string);
    y.s_ = std::move(v);
    return y;
  }
  static Yaml num(int64_t v) {
    Yaml y(Kind::integer);
    y.i_ = v;
    return y;
  }
  static Yaml flag(bool v) {
    Yaml y(Kind::boolean);
    y.b_ = v;
    return y;
  }
  static Yaml map() { return Yaml(Kind::map); }
  static Yaml list() { return Yaml(Kind::list); }
  static Yaml strings(const std::vector<std::string>& items) {
    Yaml y = list();
    for (const auto& s : items) y.add(str(s));
    return y;
  }

  // Appends `key: v` to a map (keys keep the order they were set in).
  Yaml& set(std::string key, Yaml v) {
    keys_.push_back(std::move(key));
    items_.push_back(std::move(v));
    return *this;
  }
  Yaml& add(Yaml v) {
    items_.push_back(std::move(v));
    return *this;
  }

  // A map or list written at `indent` spaces, one entry per line.
  void write(std::string& out, size_t indent) const {
    const std::string pad(indent, ' ');
    if (kind_ == Kind::map) {
      for (size_t i = 0; i < items_.size(); ++i) {
        out += pad + key(keys_[i]) + ":";
        items_[i].write_value(out, indent + 2);
      }
      return;
    }
    for (const auto& item : items_) {
      if (!item.nested() || item.items_.empty()) {
        out += pad + "-";
        item.write_value(out, indent + 2);
      } else if (item.kind_ == Kind::map) {
        // The map's first key goes on the dash's line: "- name: x".
        std::string sub;
        item.write(sub, indent + 2);
        out += pad + "- " + sub.substr(indent + 2);
      } else {
        out += pad + "-\n";
        item.write(out, indent + 2);
      }
    }
  }

 private:
  explicit Yaml(Kind k) : kind_(k) {}
  bool nested() const { return kind_ == Kind::map || kind_ == Kind::list; }

  // After "key:" or "-": a scalar on the same line, a collection on the next ones.
  void write_value(std::string& out, size_t indent) const {
    switch (kind_) {
      case Kind::string:
        out += " " + quote(s_) + "\n";
        return;
      case Kind::integer:
        out += " " + std::to_string(i_) + "\n";
        return;
      case Kind::boolean:
        out += b_ ? " true\n" : " false\n";
        return;
      case Kind::map:
      case Kind::list:
        if (items_.empty()) {
          out += kind_ == Kind::map ? " {}\n" : " []\n";
          return;
        }
        out += "\n";
        write(out, indent);
    }
  }

  // A key as a plain scalar when it can only be read back as that string, else quoted.
  static std::string key(const std::string& k) {
    static const char* const kSpecial[] = {"y", "yes", "n", "no", "true", "false", "on", "off", "null"};
    bool plain = !k.empty() && (std::isalpha(static_cast<unsigned char>(k[0])) || k[0] == '_');
    for (char c : k)
      if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.' || c == '/'))
        plain = false;
    std::string lower = k;
    for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (const char* s : kSpecial)
      if (lower == s) plain = false;
    return plain ? k : quote(k);
  }

  // A double-quoted YAML scalar: `"` and `\` escaped, and every character YAML would not keep as
  // it is (control characters, DEL, C1 controls, line and paragraph separators, BOM, U+FFFE/FFFF)
  // as an escape. Kubernetes takes UTF-8 only: other bytes are an error.
  static std::string quote(std::string_view s) {
    std::string out = "\"";
    auto hex = [&](uint32_t cp) {
      static const char* const kDigits = "0123456789abcdef";
      int width = cp <= 0xff ? 2 : 4;
      out += width == 2 ? "\\x" : "\\u";
      for (int shift = (width - 1) * 4; shift >= 0; shift -= 4) out += kDigits[(cp >> shift) & 0xf];
    };
    for (size_t i = 0; i < s.size();) {
      auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        if (c == '"')
          out += "\\\"";
        else if (c == '\\')
          out += "\\\\";
        else if (c == '\n')
          out += "\\n";
        else if (c == '\t')
          out += "\\t";
        else if (c == '\r')
          out += "\\r";
        else if (c < 0x20 || c == 0x7f)
          hex(c);
        else
          out += char(c);
        ++i;
        continue;
      }
      size_t len = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 0;
      uint32_t cp = len == 4 ? c & 0x07u : len == 3 ? c & 0x0fu : c & 0x1fu;
      bool ok = len > 0 && c < 0xf5 && i + len <= s.size();
      for (size_t k = 1; ok && k < len; ++k) {
        auto cc = static_cast<unsigned char>(s[i + k]);
        ok = (cc & 0xc0) == 0x80;
        cp = (cp << 6) | (cc & 0x3fu);
      }
      static const uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
      if (!ok || cp < kMin[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        throw Error("cannot export '" + text::excerpt(s) + "': it is not valid UTF-8",
                    "Kubernetes objects hold UTF-8 text only");
      if (cp <= 0x9f || cp == 0x2028 || cp == 0x2029 || cp == 0xfeff || cp == 0xfffe || cp == 0xffff)
        hex(cp);
      else
        out.append(s.substr(i, len));
      i += len;
    }
    return out + "\"";
  }

  Kind kind_;
  std::string s_;
  int64_t i_ = 0;
  bool b_ = false;
  std::vector<std::string> keys_;  // map keys, one per item
  std::vector<Yaml> items_;
};

// ---- what the pods run ----

enum class Target { volcano, pytorchjob };

// The default rendezvous port: torchrun's.
constexpr int kDefaultMasterPort = 29500;

// The job as pods: how many, how many ranks each, their GPUs.
struct Shape {
  int nodes = 1;
  int per_pod = 1;
  int gpus = 0;  // nvidia.com/gpu per pod; 0: none asked
  int master_port = kDefaultMasterPort;
};

std::string plural(long n, const char* what) { return std::to_string(n) + " " + what + (n == 1 ? "" : "s"); }

// Ranks per pod and pods: every pod runs the same number of ranks, so a plan with uneven hosts
// needs [cluster] procs_per_host.
Shape shape_of(const spec::JobSpec& s, const plan::Plan& p, const std::string& file) {
  Shape sh;
  sh.nodes = s.k8s.nodes > 0 ? s.k8s.nodes : std::max<int>(1, int(p.hosts.size()));
  if (s.cluster.procs_per_host > 0) {
    sh.per_pod = s.cluster.procs_per_host;
  } else if (s.k8s.nodes > 0 && s.cluster.nprocs > 0) {
    if (s.cluster.nprocs % s.k8s.nodes != 0)
      throw Error(s.origin("cluster.nprocs", file) + ": nprocs = " + std::to_string(s.cluster.nprocs) +
                      " does not split evenly over [k8s] nodes = " + std::to_string(s.k8s.nodes) + " pods (" +
                      s.origin("k8s.nodes", file) + ")",
                  "every pod runs the same number of ranks: set [cluster] procs_per_host, or an nprocs "
                  "that is a multiple of nodes");
    sh.per_pod = s.cluster.nprocs / s.k8s.nodes;
  } else {
    std::vector<std::string> counts;
    bool even = true;
    for (const auto& h : p.hosts) {
      if (counts.size() < 8) counts.push_back(std::to_string(h.ranks.size()));
      even = even && h.ranks.size() == p.hosts.front().ranks.size();
    }
    if (p.hosts.size() > counts.size()) counts.push_back("...");
    if (!even) {
      std::string key = s.origins.count("cluster.nprocs")     ? "cluster.nprocs"
                        : s.origins.count("cluster.hostfile") ? "cluster.hostfile"
                                                              : "cluster.hosts";
      throw Error(s.origin(key, file) + ": the plan puts " + text::join(counts, ", ") +
                      " ranks on its hosts, but every pod runs the same number of ranks",
                  "set [cluster] procs_per_host (the ranks of each pod)");
    }
    sh.per_pod = p.hosts.empty() ? 1 : int(p.hosts.front().ranks.size());
  }
  int64_t world = int64_t(sh.nodes) * sh.per_pod;
  if (world > spec::kMaxRanks)
    throw Error(s.origin(s.k8s.nodes ? "k8s.nodes" : "cluster.procs_per_host", file) + ": " +
                    plural(sh.nodes, "pod") + " of " + plural(sh.per_pod, "rank") + " is more than " +
                    std::to_string(spec::kMaxRanks) + " ranks; mltrain runs at most that many",
                "lower [k8s] nodes or procs_per_host");
  if (s.cluster.nprocs > 0 && s.cluster.nprocs != world)
    throw Error(s.origin("cluster.nprocs", file) + ": nprocs = " + std::to_string(s.cluster.nprocs) +
                    ", but " + plural(sh.nodes, "pod") + " of " + plural(sh.per_pod, "rank") + " make " +
                    std::to_string(world),
                "every pod runs procs_per_host ranks: make nprocs nodes x procs_per_host, or leave it out");

  // GPUs: [gpus] asks per rank, a pod asks for the sum.
  const auto& g = s.gpus;
  int needed = g.per_proc > 0        ? g.per_proc * sh.per_pod
               : g.procs_per_gpu > 0 ? (sh.per_pod + g.procs_per_gpu - 1) / g.procs_per_gpu
                                     : 0;
  sh.gpus = s.k8s.gpus_per_pod >= 0 ? s.k8s.gpus_per_pod : needed;
  std::string gpp = "[k8s] gpus_per_pod = " + std::to_string(sh.gpus);
  std::string at_gpp = s.origin("k8s.gpus_per_pod", file);
  std::string ranks = plural(sh.per_pod, "rank") + " per pod";
  if (g.procs_per_gpu > 0 && sh.gpus == 0)
    throw Error(at_gpp + ": " + gpp +
                    " gives the pods no GPU, but [gpus] procs_per_gpu = " + std::to_string(g.procs_per_gpu) +
                    " (" + s.origin("gpus.procs_per_gpu", file) + ") shares GPUs between ranks",
                "leave gpus_per_pod out (it then asks " + std::to_string(needed) + " for " + ranks +
                    "), or remove [gpus]");
  if (g.per_proc > 0 && sh.gpus == 0)
    throw Error(at_gpp + ": " + gpp + " gives the pods no GPU, but [gpus] per_proc = " +
                    std::to_string(g.per_proc) + " (" + s.origin("gpus.per_proc", file) + ")",
                "leave gpus_per_pod out (it then asks " + std::to_string(needed) + " for " + ranks +
                    "), or remove [gpus]");
  if (g.per_proc > 0 && sh.gpus % g.per_proc != 0)
    throw Error(at_gpp + ": " + gpp + " is not a multiple of [gpus] per_proc = " +
                    std::to_string(g.per_proc) + " (" + s.origin("gpus.per_proc", file) + ")",
                "each rank gets per_proc GPUs: " + ranks + " need " + std::to_string(needed));
  if (sh.gpus < needed)
    throw Error(at_gpp + ": " + gpp + " does not fit " + ranks + " with [gpus] " +
                    (g.per_proc > 0 ? "per_proc = " + std::to_string(g.per_proc)
                                    : "procs_per_gpu = " + std::to_string(g.procs_per_gpu)) +
                    ": they need " + std::to_string(needed),
                "set gpus_per_pod = " + std::to_string(needed) + ", or fewer ranks per pod (procs_per_host)");
  if (s.comm.master_port > 0) sh.master_port = s.comm.master_port;
  return sh;
}

// The job's name is the object's and its pods' (`<name>-worker-3`, a DNS label, and for the
// PyTorchJob's services a DNS-1035 one: it starts with a letter).
void check_name(const spec::JobSpec& s, const Shape& sh, const std::string& file) {
  const std::string& n = s.name;
  bool ok = !n.empty() && n.front() >= 'a' && n.front() <= 'z' && n.back() != '-';
  for (char c : n)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) ok = false;
  std::string longest = n + "-worker-" + std::to_string(std::max(0, sh.nodes - 2));
  std::string suggestion;
  for (char c : n) {
    char l = char(std::tolower(static_cast<unsigned char>(c)));
    if ((l >= 'a' && l <= 'z') || (l >= '0' && l <= '9'))
      suggestion += l;
    else if (!suggestion.empty() && suggestion.back() != '-')
      suggestion += '-';
  }
  while (!suggestion.empty() && !(suggestion.front() >= 'a' && suggestion.front() <= 'z'))
    suggestion.erase(0, 1);
  suggestion = suggestion.substr(0, 63 - (longest.size() - n.size()));
  while (!suggestion.empty() && suggestion.back() == '-') suggestion.pop_back();
  if (suggestion.empty()) suggestion = "job";
  std::string where =
      s.origins.count("name") ? s.origin("name", file) : file + ": the job's name (from the file name)";
  if (!ok)
    throw Error(
        where + ": '" + text::excerpt(n) + "' is not a Kubernetes name",
        "lowercase letters, digits and '-', starting with a letter: set name = \"" + suggestion + "\"");
  if (longest.size() > 63)
    throw Error(where + ": '" + text::excerpt(n) + "' is too long: pod names such as '" + longest +
                    "' must fit in 63 characters",
                "set a shorter name, such as name = \"" + suggestion + "\"");
}

// One container's environment: mltrain's variables first, then the job's ([run] env, then
// [k8s] env over it). A variable whose name looks secret refers to the Secret `<name>-env`.
struct ContainerEnv {
  Yaml list = Yaml::list();
  std::vector<std::string> secrets;
  bool user_cuda_visible_devices = false;
};

ContainerEnv container_env(const spec::JobSpec& s,
                           const std::vector<std::pair<std::string, std::string>>& ours) {
  ContainerEnv e;
  std::vector<std::pair<std::string, std::string>> user = s.run.env;
  for (const auto& [k, v] : s.k8s.env) {
    auto it = std::find_if(user.begin(), user.end(), [&](const auto& kv) { return kv.first == k; });
    if (it != user.end())
      it->second = v;
    else
      user.emplace_back(k, v);
  }
  auto user_sets = [&](const std::string& k) {
    return std::any_of(user.begin(), user.end(), [&](const auto& kv) { return kv.first == k; });
  };
  e.user_cuda_visible_devices = user_sets("CUDA_VISIBLE_DEVICES");
  for (const auto& [k, v] : ours)
    if (!user_sets(k)) e.list.add(Yaml::map().set("name", Yaml::str(k)).set("value", Yaml::str(v)));
  for (const auto& [k, v] : user) {
    if (!secret::is_secret_name(k)) {
      e.list.add(Yaml::map().set("name", Yaml::str(k)).set("value", Yaml::str(v)));
      continue;
    }
    e.secrets.push_back(k);
    Yaml ref = Yaml::map().set("name", Yaml::str(s.name + "-env")).set("key", Yaml::str(k));
    e.list.add(Yaml::map().set("name", Yaml::str(k)).set("valueFrom", Yaml::map().set("secretKeyRef", ref)));
  }
  return e;
}

int64_t whole_seconds(std::chrono::milliseconds d) { return (d.count() + 999) / 1000; }

// The line a pod's container runs (`/bin/sh -c LINE mltrain-rank ARGV...`): it sets the node's rank
// from what the operator gives (`node_rank`, shell text) and starts the job's argv ("$@") as its
// one rank, or as procs_per_host ranks through torchrun (each rank's own GPUs from LOCAL_RANK).
std::string start_line(const spec::JobSpec& s, const Shape& sh, const std::string& node_rank,
                       bool per_rank_gpus, bool deadline) {
  std::string set_node = "NODE_RANK=" + node_rank + "; ";
  // [run] timeout kept by the container (exit 124, which the job's policy aborts on), where the
  // target has no deadline of its own that ends the job.
  std::string exec = "exec ";
  if (deadline) {
    set_node +=
        "T=; if command -v timeout >/dev/null 2>&1; then T=\"timeout -k " +
        std::to_string(std::max<int64_t>(1, whole_seconds(s.run.grace_period))) + " " +
        std::to_string(whole_seconds(s.run.timeout)) +
        "\"; else echo 'mltrain: no timeout command in the image: [run] timeout is not kept' >&2; fi; ";
    exec = "exec $T ";
  }
  if (sh.per_pod == 1)
    return set_node +
           "export NODE_RANK GROUP_RANK=$NODE_RANK RANK=$NODE_RANK LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 "
           "WORLD_SIZE=" +
           std::to_string(sh.nodes) + "; " + exec + "\"$@\"";
  std::string rank_gpus;
  if (per_rank_gpus) {
    std::string pick;
    if (s.gpus.procs_per_gpu > 0) {
      pick = "CUDA_VISIBLE_DEVICES=$((LOCAL_RANK / " + std::to_string(s.gpus.procs_per_gpu) + "))";
    } else if (s.gpus.per_proc == 1) {
      pick = "CUDA_VISIBLE_DEVICES=$LOCAL_RANK";
    } else {
      pick = "case $LOCAL_RANK in";
      for (int l = 0; l < sh.per_pod; ++l) {
        std::vector<std::string> ids;
        for (int k = 0; k < s.gpus.per_proc; ++k) ids.push_back(std::to_string(l * s.gpus.per_proc + k));
        pick += " " + std::to_string(l) + ") CUDA_VISIBLE_DEVICES=" + text::join(ids, ",") + " ;;";
      }
      pick += " esac";
    }
    rank_gpus = "/bin/sh -c '" + pick + "; export CUDA_VISIBLE_DEVICES; exec \"$@\"' mltrain-rank ";
  }
  return set_node + "export NODE_RANK; " + exec + "torchrun --nnodes=" + std::to_string(sh.nodes) +
         " --nproc_per_node=" + std::to_string(sh.per_pod) +
         " --node_rank=$NODE_RANK --master_addr=$MASTER_ADDR --master_port=$MASTER_PORT --no_python " +
         rank_gpus + "\"$@\"";
}

struct Built {
  Yaml pod = Yaml::map();
  std::vector<std::string> secrets;
};

// The master's DNS name as the target's services give it.
std::string master_host(const spec::JobSpec& s, Target t) {
  return t == Target::volcano ? s.name + "-master-0." + s.name : s.name + "-master-0";
}

// A worker's init container: waits (at most 5 minutes) until the master's name resolves, so the
// ranks do not fail their first connect while its service is being made.
Yaml wait_for_master(const spec::JobSpec& s, Target t) {
  const char* line =
      "command -v getent >/dev/null 2>&1 || command -v nslookup >/dev/null 2>&1 || exit 0; n=0; "
      "until getent hosts \"$1\" >/dev/null 2>&1 || nslookup \"$1\" >/dev/null 2>&1; do "
      "n=$((n + 1)); if [ $n -ge 300 ]; then echo \"mltrain: the master $1 did not resolve in 300 s\" >&2; "
      "exit 1; fi; sleep 1; done";
  return Yaml::map()
      .set("name", Yaml::str("wait-for-master"))
      .set("image", Yaml::str(s.k8s.image))
      .set("command", Yaml::strings({"/bin/sh", "-c", line, "wait-for-master", master_host(s, t)}));
}

// One task's (replica type's) pod template spec; a worker's waits for the master's name.
Built pod_spec(const spec::JobSpec& s, const Shape& sh, Target t, const std::string& node_rank, bool worker) {
  std::vector<std::pair<std::string, std::string>> ours;
  if (t == Target::volcano) {
    // Volcano's svc plugin names each pod's host <job>-<task>-<index> under the job's headless
    // service; the operator of a PyTorchJob sets MASTER_ADDR and MASTER_PORT itself.
    ours.emplace_back("MASTER_ADDR", master_host(s, t));
    ours.emplace_back("MASTER_PORT", std::to_string(sh.master_port));
    ours.emplace_back("WORLD_SIZE", std::to_string(int64_t(sh.nodes) * sh.per_pod));
    ours.emplace_back("LOCAL_WORLD_SIZE", std::to_string(sh.per_pod));
  }
  bool gpus_planned = s.gpus.per_proc > 0 || s.gpus.procs_per_gpu > 0;
  if (gpus_planned) {
    ours.emplace_back("CUDA_DEVICE_ORDER", "PCI_BUS_ID");
    if (sh.per_pod == 1) {
      std::vector<std::string> ids;
      for (int k = 0; k < std::max(1, s.gpus.per_proc); ++k) ids.push_back(std::to_string(k));
      ours.emplace_back("CUDA_VISIBLE_DEVICES", text::join(ids, ","));
    }
  }
  ContainerEnv env = container_env(s, ours);
  bool per_rank_gpus = gpus_planned && sh.per_pod > 1 && !env.user_cuda_visible_devices;

  std::vector<std::string> argv =
      s.run.command ? std::vector<std::string>{"/bin/sh", "-c", *s.run.command} : s.run.argv;
  Yaml c = Yaml::map();
  c.set("name", Yaml::str(t == Target::pytorchjob ? "pytorch" : "main"));
  c.set("image", Yaml::str(s.k8s.image));
  // Volcano's pod deadline would fail the pod, which its policy restarts: the container keeps it.
  bool deadline = t == Target::volcano && s.run.timeout.count() > 0;
  c.set("command", Yaml::strings({"/bin/sh", "-c", start_line(s, sh, node_rank, per_rank_gpus, deadline),
                                  "mltrain-rank"}));
  c.set("args", Yaml::strings(argv));
  if (!s.run.workdir.empty()) c.set("workingDir", Yaml::str(s.run.workdir));
  c.set("env", env.list);
  if (t == Target::pytorchjob)
    c.set("ports", Yaml::list().add(Yaml::map()
                                        .set("name", Yaml::str("pytorchjob-port"))
                                        .set("containerPort", Yaml::num(sh.master_port))));
  if (!s.k8s.cpu.empty() || !s.k8s.memory.empty() || sh.gpus > 0) {
    Yaml limits = Yaml::map(), requests = Yaml::map();
    if (!s.k8s.cpu.empty()) {
      limits.set("cpu", Yaml::str(s.k8s.cpu));
      requests.set("cpu", Yaml::str(s.k8s.cpu));
    }
    if (!s.k8s.memory.empty()) {
      limits.set("memory", Yaml::str(s.k8s.memory));
      requests.set("memory", Yaml::str(s.k8s.memory));
    }
    if (sh.gpus > 0) limits.set("nvidia.com/gpu", Yaml::num(sh.gpus));
    Yaml res = Yaml::map().set("limits", limits);
    if (!s.k8s.cpu.empty() || !s.k8s.memory.empty()) res.set("requests", requests);
    c.set("resources", res);
  }
  // A pod's /dev/shm is 64 MiB by default: too small for NCCL and DataLoader workers.
  c.set("volumeMounts",
        Yaml::list().add(Yaml::map().set("name", Yaml::str("dshm")).set("mountPath", Yaml::str("/dev/shm"))));

  Built b;
  b.secrets = env.secrets;
  if (!s.k8s.service_account.empty()) b.pod.set("serviceAccountName", Yaml::str(s.k8s.service_account));
  if (!s.k8s.node_selector.empty()) {
    Yaml sel = Yaml::map();
    for (const auto& [k, v] : s.k8s.node_selector) sel.set(k, Yaml::str(v));
    b.pod.set("nodeSelector", sel);
  }
  // Volcano's PodFailed policy needs the pod itself to fail, not its container to restart in
  // place; a PyTorchJob's replica restartPolicy replaces the pod's.
  if (t == Target::volcano) b.pod.set("restartPolicy", Yaml::str("Never"));
  b.pod.set("terminationGracePeriodSeconds", Yaml::num(whole_seconds(s.run.grace_period)));
  if (worker) b.pod.set("initContainers", Yaml::list().add(wait_for_master(s, t)));
  b.pod.set("containers", Yaml::list().add(c));
  b.pod.set("volumes",
            Yaml::list().add(Yaml::map()
                                 .set("name", Yaml::str("dshm"))
                                 .set("emptyDir", Yaml::map().set("medium", Yaml::str("Memory")))));
  return b;
}

// "# ..." lines: what was written and what the user still has to do. Only names and numbers
// mltrain checked (the job's name, variable names) appear here, never a value.
std::string header(const spec::JobSpec& s, const Shape& sh, Target t, const std::vector<std::string>& secrets,
                   const std::vector<std::string>& warnings) {
  std::string out = "# " + std::string(t == Target::volcano ? "Volcano Job" : "Kubeflow PyTorchJob") +
                    " for mltrain job \"" + s.name + "\": " + plural(sh.nodes, "pod") + " x " +
                    plural(sh.per_pod, "rank") + " (WORLD_SIZE " +
                    std::to_string(int64_t(sh.nodes) * sh.per_pod) + "), written by `mltrain export`.\n";
  out += t == Target::volcano ? "# Needs Volcano (its scheduler and job controller) in the cluster.\n"
                              : "# Needs the Kubeflow training operator (v1.7 or later) in the cluster.\n";
  out += "# Apply: kubectl apply -f FILE (or pipe it: mltrain export ... | kubectl apply -f -)\n";
  if (!secrets.empty()) {
    std::string ns = s.k8s.namespace_name.empty() ? "" : " -n " + s.k8s.namespace_name;
    out += "# The Secret \"" + s.name + "-env\" must hold " + text::join(secrets, ", ") + ":\n";
    out += "#   kubectl create secret generic " + s.name + "-env" + ns;
    for (const auto& k : secrets) out += " --from-literal=" + k + "=...";
    out += "\n";
  }
  // A forward_env glob that no exported variable matches brings nothing into the pods.
  std::vector<std::string> unmatched;
  for (const auto& glob : s.run.forward_env) {
    bool covered = false;
    for (const auto* env : {&s.run.env, &s.k8s.env})
      for (const auto& kv : *env) covered = covered || ::fnmatch(glob.c_str(), kv.first.c_str(), 0) == 0;
    if (!covered) unmatched.push_back(text::excerpt(glob, 40));
  }
  std::vector<std::string> left;
  if (!unmatched.empty())
    left.push_back("[run] forward_env " + text::join(unmatched, " ") +
                   " (no launcher environment in a cluster: name them in [k8s] env)");
  if (s.sync.enabled || !s.setup.command.empty())
    left.push_back("[sync] and [setup] (the image holds the code)");
  if (!left.empty()) out += "# Not exported: " + text::join(left, "; ") + ".\n";
  out +=
      "# Pods have no mltrain agent or store: workers on mltrain's comm library (import mltrain, "
      "libmltrain-comm, the hook) do not run there; torch.distributed ones do.\n";
  for (const auto& w : warnings) out += "# Warning: " + w + "\n";
  return out;
}

Yaml metadata(const spec::JobSpec& s) {
  Yaml m = Yaml::map().set("name", Yaml::str(s.name));
  if (!s.k8s.namespace_name.empty()) m.set("namespace", Yaml::str(s.k8s.namespace_name));
  return m;
}

void add_secrets(std::vector<std::string>& all, const std::vector<std::string>& more) {
  for (const auto& k : more)
    if (std::find(all.begin(), all.end(), k) == all.end()) all.push_back(k);
}

std::string volcano_job(const spec::JobSpec& s, const Shape& sh, const std::vector<std::string>& warnings) {
  Built master = pod_spec(s, sh, Target::volcano, "0", false);
  Built worker = pod_spec(s, sh, Target::volcano, "$((VK_TASK_INDEX + 1))", true);
  // Gang: every pod or none. A failed or evicted pod restarts the whole job while max_restarts
  // allows; Volcano fails the job when its retry count, raised at each restart, reaches maxRetry.
  const char* action = s.run.max_restarts > 0 ? "RestartJob" : "AbortJob";
  Yaml policies = Yaml::list();
  // The container's deadline (exit 124) ends the job, as mltrain run's does; Volcano takes the
  // first policy that matches, so it goes before PodFailed's.
  if (s.run.timeout.count() > 0)
    policies.add(Yaml::map().set("exitCode", Yaml::num(124)).set("action", Yaml::str("AbortJob")));
  for (const char* event : {"PodEvicted", "PodFailed"})
    policies.add(Yaml::map().set("event", Yaml::str(event)).set("action", Yaml::str(action)));
  Yaml tasks = Yaml::list();
  tasks.add(Yaml::map()
                .set("name", Yaml::str("master"))
                .set("replicas", Yaml::num(1))
                .set("template", Yaml::map().set("spec", master.pod)));
  if (sh.nodes > 1)
    tasks.add(Yaml::map()
                  .set("name", Yaml::str("worker"))
                  .set("replicas", Yaml::num(sh.nodes - 1))
                  .set("template", Yaml::map().set("spec", worker.pod)));
  Yaml spec = Yaml::map()
                  .set("schedulerName", Yaml::str("volcano"))
                  .set("minAvailable", Yaml::num(sh.nodes))
                  .set("maxRetry", Yaml::num(s.run.max_restarts + 1))
                  .set("plugins", Yaml::map().set("svc", Yaml::list()).set("env", Yaml::list()))
                  .set("policies", policies)
                  .set("tasks", tasks);
  Yaml doc = Yaml::map()
                 .set("apiVersion", Yaml::str("batch.volcano.sh/v1alpha1"))
                 .set("kind", Yaml::str("Job"))
                 .set("metadata", metadata(s))
                 .set("spec", spec);
  std::vector<std::string> secrets = master.secrets;
  add_secrets(secrets, worker.secrets);
  std::string out = header(s, sh, Target::volcano, secrets, warnings);
  doc.write(out, 0);
  return out;
}

std::string pytorch_job(const spec::JobSpec& s, const Shape& sh, const std::vector<std::string>& warnings) {
  // The operator sets RANK to the pod's index (Master 0, Worker i+1): the node's rank.
  Built pod = pod_spec(s, sh, Target::pytorchjob, "$RANK", false);
  Built worker = pod_spec(s, sh, Target::pytorchjob, "$RANK", true);
  // OnFailure restarts a failed pod's container in place, counted against backoffLimit.
  const char* restart = s.run.max_restarts > 0 ? "OnFailure" : "Never";
  auto replica = [&](int n, const Built& b) {
    return Yaml::map()
        .set("replicas", Yaml::num(n))
        .set("restartPolicy", Yaml::str(restart))
        .set("template", Yaml::map().set("spec", b.pod));
  };
  Yaml replicas = Yaml::map().set("Master", replica(1, pod));
  if (sh.nodes > 1) replicas.set("Worker", replica(sh.nodes - 1, worker));
  // The operator fails the job once its pods' restart counts sum to backoffLimit
  // (PastBackoffLimit): max_restarts restarts need one more.
  Yaml run_policy = Yaml::map()
                        .set("backoffLimit", Yaml::num(s.run.max_restarts > 0 ? s.run.max_restarts + 1 : 0))
                        // The job's end stops the pods still running: a failed rank ends the gang.
                        .set("cleanPodPolicy", Yaml::str("Running"))
                        .set("schedulingPolicy", Yaml::map().set("minAvailable", Yaml::num(sh.nodes)));
  if (s.run.timeout.count() > 0)
    run_policy.set("activeDeadlineSeconds", Yaml::num(whole_seconds(s.run.timeout)));
  Yaml spec = Yaml::map()
                  .set("nprocPerNode", Yaml::str(std::to_string(sh.per_pod)))
                  .set("runPolicy", run_policy)
                  .set("pytorchReplicaSpecs", replicas);
  Yaml doc = Yaml::map()
                 .set("apiVersion", Yaml::str("kubeflow.org/v1"))
                 .set("kind", Yaml::str("PyTorchJob"))
                 .set("metadata", metadata(s))
                 .set("spec", spec);
  std::string out = header(s, sh, Target::pytorchjob, pod.secrets, warnings);
  doc.write(out, 0);
  return out;
}

Target target_of(const std::string& to) {
  const std::vector<std::string> names = {"volcano", "pytorchjob"};
  std::string lower = to;
  for (auto& c : lower) c = char(std::tolower(static_cast<unsigned char>(c)));
  if (lower == "volcano") return Target::volcano;
  if (lower == "pytorchjob") return Target::pytorchjob;
  throw Error("--to '" + text::excerpt(to) + "' is not an export target" + text::did_you_mean(to, names),
              "targets: volcano (a Volcano Job), pytorchjob (a Kubeflow PyTorchJob)");
}

}  // namespace

// What the manifest may get wrong without being refused: the laptop's workdir, a backend of
// mltrain's comm library.
std::vector<std::string> export_warnings(const spec::JobSpec& s, const std::string& file) {
  std::vector<std::string> w;
  std::string spec_dir = fs::absolute(file).parent_path().lexically_normal().string();
  const std::string& wd = s.run.workdir;
  if (!wd.empty() && (wd == spec_dir || wd.rfind(spec_dir + "/", 0) == 0))
    w.push_back(s.origin("run.workdir", file) + ": workdir '" + text::excerpt(wd) +
                "' is this machine's folder (a relative workdir is taken from the spec's folder); the "
                "image probably has no such path: give the image's, like workdir = \"/workspace\"");
  if (s.origins.count("comm.backend") && s.comm.backend != "auto")
    w.push_back(s.origin("comm.backend", file) + ": [comm] backend = \"" + s.comm.backend +
                "\" is mltrain's comm library, which does not run in pods (no agent, no store)");
  if (s.cluster.min_hosts > 0 || !s.cluster.spares.empty())
    w.push_back(s.origin(s.cluster.min_hosts > 0 ? "cluster.min_hosts" : "cluster.spares", file) +
                ": min_hosts and spares are mltrain run's elastic restarts (docs/elastic.md); the exported "
                "job has the hosts alone, and the operator restarts its pods as it does");
  return w;
}

std::string export_manifest(const JobRequest& req, const std::string& to,
                            std::vector<std::string>* warnings) {
  Target t = target_of(to);
  if (req.specs.empty())
    throw Error("mltrain export needs a job spec with a [k8s] table",
                "mltrain export --to " + to + " job.toml (see docs/k8s.md)");
  spec::JobSpec s = resolve_spec(req);
  const std::string file = s.source;
  if (!s.k8s.present)
    throw Error(file + ": no [k8s] table: mltrain export needs at least [k8s] image",
                "add a table like: [k8s] image = \"ghcr.io/acme/train:1.4\" (see docs/k8s.md)");
  if (s.k8s.image.empty())
    throw Error(s.origin("k8s", file) + ": [k8s] has no 'image': the pods need one",
                "add image = \"ghcr.io/acme/train:1.4\" to [k8s]");
  if (s.comm.mode == "ps")
    throw Error(s.ps.present
                    ? s.origin("ps", file) +
                          ": a [ps] job cannot be exported: its servers run inside "
                          "mltrain's agent"
                    : s.origin("comm.mode", file) +
                          ": [comm] mode = \"ps\" cannot be exported: its servers run inside mltrain's agent",
                "export an allreduce job, or run this one with mltrain run");
  std::vector<std::string> w = export_warnings(s, file);
  s.cluster.min_hosts = 0;  // the pods are the hosts; spares are no pods
  s.cluster.spares.clear();
  plan::Plan p = plan::make_plan(s, detail::plan_inputs(req, "export", "export", detail::Ports::placeholder));
  Shape sh = shape_of(s, p, file);
  check_name(s, sh, file);
  if (warnings) *warnings = w;
  return t == Target::volcano ? volcano_job(s, sh, w) : pytorch_job(s, sh, w);
}

}  // namespace mltrain::launch
