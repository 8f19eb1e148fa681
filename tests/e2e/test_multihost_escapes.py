"""No process escapes a job on a test host (over SSH, as the cluster's plain user): the same ranks
and endings as test_escapes.py, 5 runs of each. A one-host cluster of its own."""
import pytest

from cluster import Cluster, available
from escapes import ENDINGS, check_ending
from multihost_fixtures import mh, shared_root  # noqa: F401


@pytest.fixture(scope="module")
def cluster():
    ok, why = available()
    if not ok:
        pytest.skip(why)
    c = Cluster.up(n=1)
    try:
        yield c
    finally:
        c.down()


@pytest.mark.slow
@pytest.mark.parametrize("round", range(5))
@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_escapes_on_a_host(mh, ending, round):
    check_ending(mh.ml, ending, mh.shared, run_args=("-H", "h1:4", "--workdir", "/tmp"),
                 popen=mh.popen, run=lambda *a: mh.run(*a, timeout=60))
