// One typed accessor per row of knobs/knobs.def (as NCCL_PARAM does), so no code names a variable as
// a string: knobs::mltrain_heartbeat_timeout.get() is a duration, knobs::home.is_set() a bool. The
// accessor's name is the variable's in lower case; its type follows the row's kind.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

#include "knobs/registry.h"

namespace mltrain::knobs {

// The type a knob of kind K reads as: choices and strings as text.
template <Kind K>
using ValueOf = std::conditional_t<
    K == Kind::duration, std::chrono::milliseconds,
    std::conditional_t<K == Kind::integer, std::int64_t,
                       std::conditional_t<K == Kind::bytes, std::uint64_t,
                                          std::conditional_t<K == Kind::flag, bool, std::string>>>>;

// A row's position in all(): the rows are declared in knobs.def's order.
enum class Id : unsigned {
#define MLTRAIN_KNOB(id, ...) id,
#include "knobs/knobs.def"
#undef MLTRAIN_KNOB
};

template <Kind K>
class Var {
 public:
  using Value = ValueOf<K>;

  constexpr explicit Var(Id id) : id_(id) {}

  // Its row of the table.
  const Knob& knob() const { return all()[static_cast<unsigned>(id_)]; }
  std::string_view name() const { return knob().name; }
  // The environment's value when set and non-empty, else the default; throws BadValue for a value
  // its kind cannot parse.
  Value get() const;
  // True when the variable is set to a non-empty value.
  bool is_set() const;
  // The variable as the environment holds it, set but empty included; nullopt when unset.
  std::optional<std::string> raw() const;
  // The same checks on a text from elsewhere (a job spec's env table, a captured environment).
  Value value_of(std::string_view text) const;
  // Its value in an environment given as a map (the launcher's, captured for a plan): a pointer to
  // the map's value, nullptr when the map lacks it.
  template <class Env>
  const std::string* in(const Env& env) const {
    auto it = env.find(std::string(name()));
    return it == env.end() ? nullptr : &it->second;
  }

 private:
  Id id_;
};

extern template class Var<Kind::duration>;
extern template class Var<Kind::integer>;
extern template class Var<Kind::bytes>;
extern template class Var<Kind::choice>;
extern template class Var<Kind::string>;
extern template class Var<Kind::flag>;

#define MLTRAIN_KNOB(id, name, kind, ...) inline constexpr Var<Kind::kind> id{Id::id};
#include "knobs/knobs.def"
#undef MLTRAIN_KNOB

}  // namespace mltrain::knobs
