// Every environment variable mltrain reads (the launcher, the agent and the comm library), declared
// once with its kind, default and help (knobs/knobs.def). `mltrain knobs` prints this table; the
// getters read a variable and parse it with its kind's parser (knobs/parse.h). Code reads a knob
// through its typed accessor (knobs/knobs.h); the getters by name serve what is not yet converted.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace mltrain::knobs {

enum class Kind { duration, integer, bytes, choice, string, flag };

// Who reads a knob (a bit set).
enum Reader : unsigned { launcher = 1u, comm = 2u, agent = 4u };

struct Knob {
  std::string_view name;
  Kind kind;
  // What the getters return when the variable is unset or empty ("" = nothing: the caller decides,
  // as for MLTRAIN_STORE_ADDR, whose default is computed from other variables).
  std::string_view default_value;
  std::string_view help;
  unsigned readers;
  // Kind::choice: the allowed values, separated by '|'. Otherwise empty.
  std::string_view choices = {};
  // What `mltrain knobs` shows as the default when it is computed rather than a value.
  std::string_view default_shown = {};
};

// A variable set to a value its kind cannot parse. what() names the variable, the value and the
// form expected, e.g. "MLTRAIN_COMM_TIMEOUT='5x' is not a duration (write it like 90s, 5m, 1h30m)".
class BadValue : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

// The whole table, in the order `mltrain knobs` prints it.
std::span<const Knob> all();
// The knob called `name`, or nullptr.
const Knob* find(std::string_view name);
// "launcher", "comm", "launcher,agent", ...
std::string readers_text(unsigned readers);
// "duration", "bytes", "auto|tcp|shm", ...
std::string kind_text(const Knob& k);

// The variable as the environment holds it, set but empty included; nullopt when unset.
std::optional<std::string> current(const Knob& k);

// The raw value: the environment's when set and non-empty, else the knob's default_value.
// Every getter throws std::logic_error for a name the table does not declare (a bug, caught by the
// unit test that scans the sources) and BadValue for a value that does not parse.
std::string get_string(std::string_view name);
// True when the variable is set to a non-empty value.
bool is_set(std::string_view name);
// current() of the declared knob `name` (CUDA_VISIBLE_DEVICES="" hides every GPU: empty counts).
std::optional<std::string> get_raw(std::string_view name);
std::chrono::milliseconds get_duration(std::string_view name);
std::int64_t get_int(std::string_view name);
std::uint64_t get_bytes(std::string_view name);
bool get_flag(std::string_view name);
// One of the knob's choices.
std::string get_choice(std::string_view name);

// The same checks on a given text instead of the environment (for tests and for values that come
// from elsewhere, such as a job spec's env table).
std::chrono::milliseconds duration_value(const Knob& k, std::string_view text);
std::int64_t int_value(const Knob& k, std::string_view text);
std::uint64_t bytes_value(const Knob& k, std::string_view text);
bool flag_value(const Knob& k, std::string_view text);
std::string choice_value(const Knob& k, std::string_view text);

}  // namespace mltrain::knobs
