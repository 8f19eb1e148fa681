"""No process escapes a job on a test host (over SSH, as the cluster's plain user): the same ranks
and endings as test_escapes.py, 5 runs of each. A one-host cluster of its own."""
import pytest

from escapes import ENDINGS, check_ending
from multihost_fixtures import mh, module_cluster, shared_root  # noqa: F401


cluster = module_cluster(n=1)


@pytest.mark.slow
@pytest.mark.parametrize("round", range(5))
@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_escapes_on_a_host(mh, ending, round):
    check_ending(mh.ml, ending, mh.shared, run_args=("-H", "h1:4", "--workdir", "/tmp"),
                 popen=mh.popen, run=lambda *a: mh.run(*a, timeout=60))
