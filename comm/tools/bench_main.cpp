#include "mltrain/bench.hpp"

int main(int argc, char** argv) { return mltrain::comm::bench_main(argc, argv); }
