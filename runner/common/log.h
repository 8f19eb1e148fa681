// Logging by subsystem ("spec", "supervise", "transport", ...), quiet by default.
// `-v` or MLTRAIN_LOG=debug|info|warn turns it up. spdlog stays inside log.cpp.
#pragma once

#include <string>
#include <string_view>

namespace mltrain::log {

enum class Level { debug, info, warn, error, off };

void set_level(Level l);
// Reads MLTRAIN_LOG (through the knobs registry). Returns "" or, when it is set to something
// unknown, why (the level is then left as it was).
std::string set_level_from_env();
bool enabled(Level l);
void write(Level l, std::string_view subsystem, std::string_view message);

inline void debug(std::string_view sub, std::string_view msg) {
  if (enabled(Level::debug)) write(Level::debug, sub, msg);
}
inline void info(std::string_view sub, std::string_view msg) {
  if (enabled(Level::info)) write(Level::info, sub, msg);
}
inline void warn(std::string_view sub, std::string_view msg) { write(Level::warn, sub, msg); }
inline void error(std::string_view sub, std::string_view msg) { write(Level::error, sub, msg); }

}  // namespace mltrain::log
