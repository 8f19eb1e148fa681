#include <cstdio>
#include <mltrain/comm.hpp>
int main() {
  auto c = mltrain::comm::Communicator::init_from_env();
  float x[2] = {1, 2};
  c->allreduce(x, 2, mltrain::comm::DataType::f32, mltrain::comm::ReduceOp::sum);
  std::printf("rank %d/%d: %g %g\n", c->rank(), c->size(), x[0], x[1]);
}
