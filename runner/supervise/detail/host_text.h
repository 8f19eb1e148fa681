// Text a host sends, made safe where it enters the launcher: every message's display fields
// (problems, messages, names, versions, notes) through text::host_text, before any handler sees
// them, so no print, record or JSON document downstream can carry a host's escape codes or cut
// text at a NUL. Internal to supervise/.
#pragma once

#include "runner/protocol/protocol.h"

namespace mltrain::supervise::detail {

// Fields that stay raw because they are data, not text to show: rank and setup output (escaped
// when shown, kept byte for byte in logs), pulled file names and bytes (written as named; any
// message naming one escapes it), telemetry samples (parsed; their views escape), the error file
// (parsed, then escaped), addresses, interface names and ports (used, not shown as they came).
void sanitise_host_text(agent::Message& m);

}  // namespace mltrain::supervise::detail
