#include "runner/common/log.h"

#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "knobs/knobs.h"

namespace mltrain::log {
namespace {

Level g_level = Level::warn;

spdlog::level::level_enum to_spd(Level l) {
  switch (l) {
    case Level::debug:
      return spdlog::level::debug;
    case Level::info:
      return spdlog::level::info;
    case Level::warn:
      return spdlog::level::warn;
    case Level::error:
      return spdlog::level::err;
    case Level::off:
      return spdlog::level::off;
  }
  return spdlog::level::warn;
}

// One logger per subsystem, all writing to stderr with the subsystem in the line.
spdlog::logger& logger(std::string_view subsystem) {
  static std::mutex mu;
  static std::map<std::string, std::shared_ptr<spdlog::logger>, std::less<>> loggers;
  static auto sink = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  std::lock_guard<std::mutex> lock(mu);
  auto it = loggers.find(subsystem);
  if (it == loggers.end()) {
    auto l = std::make_shared<spdlog::logger>("mltrain." + std::string(subsystem), sink);
    l->set_pattern("mltrain: %^%l%$ [%n] %v");
    l->set_level(spdlog::level::trace);
    it = loggers.emplace(std::string(subsystem), l).first;
  }
  return *it->second;
}

}  // namespace

void set_level(Level l) { g_level = l; }

std::string set_level_from_env() {
  std::string s;
  try {
    s = knobs::mltrain_log.get();
  } catch (const knobs::BadValue& e) {
    return e.what();
  }
  if (s == "debug")
    g_level = Level::debug;
  else if (s == "info")
    g_level = Level::info;
  else if (s == "warn")
    g_level = Level::warn;
  else if (s == "error")
    g_level = Level::error;
  else
    g_level = Level::off;
  return "";
}

bool enabled(Level l) { return l >= g_level && g_level != Level::off; }

void write(Level l, std::string_view subsystem, std::string_view message) {
  if (!enabled(l)) return;
  logger(subsystem).log(to_spd(l), "{}", message);
}

}  // namespace mltrain::log
