// The one clock comm's waits and deadlines use: monotonic, never the wall clock.
#pragma once

#include <chrono>

namespace mltrain::comm::detail {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

}  // namespace mltrain::comm::detail
