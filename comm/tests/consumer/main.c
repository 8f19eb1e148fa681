#include <mltrain/comm.h>
#include <stdio.h>
int main(void) {
  mltrain_comm_t* c;
  if (mltrain_comm_init_from_env(&c) != 0) {
    fprintf(stderr, "%s\n", mltrain_comm_last_error());
    return 1;
  }
  double x = mltrain_comm_rank(c);
  mltrain_comm_allreduce(c, &x, &x, 1, MLTRAIN_F64, MLTRAIN_MAX);
  printf("C rank %d: max rank %g\n", mltrain_comm_rank(c), x);
  mltrain_comm_destroy(c);
  return 0;
}
