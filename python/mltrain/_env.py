"""The environment variables the package reads, each read here alone.

They are declared with the launcher's, the agent's and the comm library's in one table
(knobs/include/knobs/knobs.def; `mltrain knobs` lists them); tests/e2e/test_knobs.py checks that
every name in NAMES is there.
"""
import os

NAMES = ("MLTRAIN_COMM_LIB", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MLTRAIN_METRICS_FD")


def comm_lib():
    """The libmltrain-comm to load (the agent of `mltrain run` sets it), or None."""
    return os.environ.get("MLTRAIN_COMM_LIB") or None


def local_rank():
    """This rank's index on its host."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def local_world_size():
    """The number of ranks on this host."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def metrics_fd():
    """The descriptor of this rank's metrics pipe (`mltrain run` sets it), or None."""
    fd = os.environ.get("MLTRAIN_METRICS_FD", "")
    return int(fd) if fd.isdigit() else None
