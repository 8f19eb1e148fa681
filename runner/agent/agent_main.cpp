#include <cstring>

#include "runner/agent/agent.h"

int main(int argc, char** argv) {
  if (argc == 2 && std::strcmp(argv[1], "--runtime-dir") == 0) return mltrain::agent::print_runtime_dir();
  return mltrain::agent::run_agent();
}
