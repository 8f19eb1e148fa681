// nccl-tests style benchmark of the comm library; one process per rank (env as for
// init_from_env). Rank 0 prints the table (or JSON Lines with --json, docs/json.md). Returns an exit code.
#pragma once

namespace mltrain::comm {
int bench_main(int argc, char** argv);
}
