#include "runner/common/color.h"

#include <cstddef>
#include <iterator>

namespace mltrain {

namespace {
const char* const kColors[] = {"\033[36m", "\033[33m", "\033[32m", "\033[35m", "\033[34m", "\033[31m",
                               "\033[96m", "\033[93m", "\033[92m", "\033[95m", "\033[94m", "\033[91m"};
}  // namespace

const char* rank_color(int rank) { return kColors[static_cast<std::size_t>(rank) % std::size(kColors)]; }

}  // namespace mltrain
