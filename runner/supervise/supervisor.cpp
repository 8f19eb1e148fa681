#include "runner/supervise/supervisor.h"

#include "runner/supervise/detail/gang.h"

namespace mltrain::supervise {

int run_job(plan::Plan& plan, records::RunRecord& record, const Options& opts,
            const TransportFor& transport_for) {
  detail::Gang g(plan, record, opts, transport_for);
  return g.run();
}

}  // namespace mltrain::supervise
