"""No process escapes a job on localhost: a double-forked daemon, a re-forker that ignores TERM, a
200-process setsid tree and a subreaper rank leave nothing behind after a normal end, another rank
failing, `mltrain stop`, Ctrl-C, a SIGKILLed launcher or a SIGKILLed agent; 5 runs of each."""
import pytest

from escapes import ENDINGS, check_ending


@pytest.mark.slow
@pytest.mark.parametrize("round", range(5))
@pytest.mark.parametrize("ending", ENDINGS)
def test_nothing_escapes_locally(ml, tmp_path, ending, round):
    ready = tmp_path / "ready"
    ready.mkdir()
    check_ending(ml, ending, ready)
