#include <cstring>

#include "runner/agent/agent_core.h"
#include "runner/agent/runtime.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--runtime-dir") == 0) return mltrain::agent::print_runtime_dir();
  return mltrain::agent::run_agent(mltrain::agent::unpack_runtime);
}
