// Terminal colours shared by every view that prints rank output (`run` and `logs`).
#pragma once

namespace mltrain {

// The ANSI colour of a rank's prefix: the same rank has the same colour in `run` and `logs`.
const char* rank_color(int rank);
inline constexpr const char* kColorReset = "\033[0m";

}  // namespace mltrain
