#include "runner/supervise/detail/host_text.h"

#include <type_traits>

#include "runner/common/text.h"

namespace mltrain::supervise::detail {

namespace msg = mltrain::agent::msg;

namespace {

// A host's message is a line or a few, not a document: what a terminal line can take.
constexpr size_t kMaxHostText = 4096;

void clean(std::string& s) { s = text::host_text(s, kMaxHostText); }
void clean(std::vector<std::string>& v) {
  for (auto& s : v) clean(s);
}
void clean(std::vector<agent::Gpu>& gpus) {
  for (auto& g : gpus) clean(g.uuid), clean(g.name);
}

}  // namespace

void sanitise_host_text(agent::Message& m) {
  std::visit(
      [](auto& x) {
        using M = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<M, msg::HelloAck>) {
          clean(x.hostname), clean(x.arch);
        } else if constexpr (std::is_same_v<M, msg::SpawnFailed> || std::is_same_v<M, msg::AgentError> ||
                             std::is_same_v<M, msg::SetupDone>) {
          clean(x.message);
        } else if constexpr (std::is_same_v<M, msg::Prepared>) {
          clean(x.problems), clean(x.gpus), clean(x.gpu_source), clean(x.gpu_note);
        } else if constexpr (std::is_same_v<M, msg::Probed>) {
          clean(x.facts), clean(x.gpus);
        } else if constexpr (std::is_same_v<M, msg::SyncWant>) {
          clean(x.dir), clean(x.problems);
        } else if constexpr (std::is_same_v<M, msg::SyncDone> || std::is_same_v<M, msg::PullDone>) {
          clean(x.problems);
        } else if constexpr (std::is_same_v<M, msg::PsLog>) {
          clean(x.line);
        }
      },
      m);
}

}  // namespace mltrain::supervise::detail
