#include "runner/agent/agent.h"

int main() { return mltrain::agent::run_agent(); }
