#include "knobs/registry.h"

#include <cstdlib>
#include <optional>
#include <string>

#include "knobs/knobs.h"
#include "knobs/parse.h"

namespace mltrain::knobs {

namespace {

// The table, from the one declaration of each variable.
const Knob kKnobs[] = {
#define MLTRAIN_KNOB(id, name, kind, default_value, readers, choices, shown, help) \
  {name, Kind::kind, default_value, help, readers, choices, shown},
#include "knobs/knobs.def"
#undef MLTRAIN_KNOB
};

const Knob& declared(std::string_view name) {
  if (const Knob* k = find(name)) return *k;
  throw std::logic_error("environment variable " + std::string(name) +
                         " is read but not declared in knobs/include/knobs/knobs.def");
}

std::string_view value_or_default(const Knob& k) {
  const std::string name(k.name);
  const char* value = std::getenv(name.c_str());
  if (value == nullptr || *value == '\0') return k.default_value;
  return value;
}

[[noreturn]] void bad(const Knob& k, std::string_view text, const std::string& expected) {
  throw BadValue(std::string(k.name) + "='" + std::string(text) + "' " + expected);
}

}  // namespace

std::span<const Knob> all() { return kKnobs; }

const Knob* find(std::string_view name) {
  for (const Knob& k : kKnobs)
    if (k.name == name) return &k;
  return nullptr;
}

std::string readers_text(unsigned readers) {
  std::string out;
  for (auto [bit, word] : {std::pair{launcher, "launcher"}, {comm, "comm"}, {agent, "agent"}})
    if (readers & bit) out += (out.empty() ? "" : ",") + std::string(word);
  return out;
}

std::string kind_text(const Knob& k) {
  switch (k.kind) {
    case Kind::duration:
      return "duration";
    case Kind::integer:
      return "integer";
    case Kind::bytes:
      return "bytes";
    case Kind::choice:
      return std::string(k.choices);
    case Kind::string:
      return "string";
    case Kind::flag:
      return "flag";
  }
  return "?";
}

std::chrono::milliseconds duration_value(const Knob& k, std::string_view text) {
  if (auto d = parse_duration(text)) return *d;
  bad(k, text, "is not a duration (write it like 90s, 5m, 1h30m; a bare number is seconds)");
}

std::int64_t int_value(const Knob& k, std::string_view text) {
  if (auto v = parse_int(text)) return *v;
  bad(k, text, "is not an integer");
}

std::uint64_t bytes_value(const Knob& k, std::string_view text) {
  if (auto v = parse_bytes(text)) return *v;
  bad(k, text, "is not a size (write it like 4096, 64K, 1M, 2G)");
}

bool flag_value(const Knob& k, std::string_view text) {
  if (auto v = parse_flag(text)) return *v;
  bad(k, text, "is not a flag (write 1 or 0, true or false)");
}

std::string choice_value(const Knob& k, std::string_view text) {
  std::string_view rest = k.choices;
  while (!rest.empty()) {
    const size_t bar = rest.find('|');
    const std::string_view choice = rest.substr(0, bar);
    if (choice == text) return std::string(choice);
    rest = bar == std::string_view::npos ? std::string_view() : rest.substr(bar + 1);
  }
  // "a|b|c" reads "a, b or c".
  std::string expected(k.choices);
  const size_t last = expected.rfind('|');
  if (last != std::string::npos) expected.replace(last, 1, " or ");
  for (auto& c : expected)
    if (c == '|') c = ',';
  size_t comma = 0;
  while ((comma = expected.find(',', comma)) != std::string::npos) expected.insert(++comma, " ");
  bad(k, text, "(expected " + expected + ")");
}

namespace {

// A text as a knob of kind K reads it.
template <Kind K>
ValueOf<K> parsed(const Knob& k, std::string_view text) {
  if constexpr (K == Kind::duration)
    return duration_value(k, text);
  else if constexpr (K == Kind::integer)
    return int_value(k, text);
  else if constexpr (K == Kind::bytes)
    return bytes_value(k, text);
  else if constexpr (K == Kind::choice)
    return choice_value(k, text);
  else if constexpr (K == Kind::flag)
    return flag_value(k, text);
  else
    return std::string(text);
}

}  // namespace

template <Kind K>
typename Var<K>::Value Var<K>::get() const {
  return parsed<K>(knob(), value_or_default(knob()));
}

template <Kind K>
bool Var<K>::is_set() const {
  return knobs::is_set(name());
}

template <Kind K>
std::optional<std::string> Var<K>::raw() const {
  return current(knob());
}

template <Kind K>
typename Var<K>::Value Var<K>::value_of(std::string_view text) const {
  return parsed<K>(knob(), text);
}

template class Var<Kind::duration>;
template class Var<Kind::integer>;
template class Var<Kind::bytes>;
template class Var<Kind::choice>;
template class Var<Kind::string>;
template class Var<Kind::flag>;

std::optional<std::string> current(const Knob& k) {
  const char* value = std::getenv(std::string(k.name).c_str());
  return value ? std::optional<std::string>(value) : std::nullopt;
}

std::string get_string(std::string_view name) { return std::string(value_or_default(declared(name))); }

bool is_set(std::string_view name) {
  const Knob& k = declared(name);
  const char* value = std::getenv(std::string(k.name).c_str());
  return value != nullptr && *value != '\0';
}

std::optional<std::string> get_raw(std::string_view name) { return current(declared(name)); }

std::chrono::milliseconds get_duration(std::string_view name) {
  const Knob& k = declared(name);
  return duration_value(k, value_or_default(k));
}

std::int64_t get_int(std::string_view name) {
  const Knob& k = declared(name);
  return int_value(k, value_or_default(k));
}

std::uint64_t get_bytes(std::string_view name) {
  const Knob& k = declared(name);
  return bytes_value(k, value_or_default(k));
}

bool get_flag(std::string_view name) {
  const Knob& k = declared(name);
  return flag_value(k, value_or_default(k));
}

std::string get_choice(std::string_view name) {
  const Knob& k = declared(name);
  return choice_value(k, value_or_default(k));
}

}  // namespace mltrain::knobs
