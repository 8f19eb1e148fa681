// Files written whole or not at all.
#pragma once

#include <string>
#include <string_view>

namespace mltrain {

// Writes `data` to `path` whole or not at all: into a hidden sibling `.NAME.tmp` (created 0600,
// never through a link), flushed to disk first when `durable`, then renamed over `path`. On
// failure returns false with `error` saying what failed on which file ("write /x/.run.json.tmp:
// No space left on device"); `path` keeps what it held and the temporary file is removed.
bool replace_file(const std::string& path, std::string_view data, bool durable, std::string& error);

}  // namespace mltrain
