"""Issue 16, item 9: inputs past sane bounds get a short, located error at once, never minutes of
work, gigabytes of memory, megabytes of message or a clock overflow that ends the job at once."""
import time

import pytest


def _refused(ml, *args, code=2):
    t0 = time.monotonic()
    r = ml(*args, timeout=20)
    took = time.monotonic() - t0
    assert r.returncode == code, (r.returncode, r.stderr[:500])
    assert took < 5, f"took {took:.1f}s"
    assert len(r.stderr) < 2000, f"{len(r.stderr)} bytes of error"
    return r.stderr


def test_huge_unknown_key_is_a_short_message(ml):
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n' + "k" * 2_000_000 + " = 1\n")
    err = _refused(ml, "validate", spec)
    assert "job.toml:3:1: unknown key 'kkkk" in err and "...'" in err


def test_profile_that_never_ends_is_refused(ml):
    spec = ml.write("job.toml", 'profile = "/dev/zero"\n[run]\ncommand = "true"\n')
    err = _refused(ml, "validate", spec)
    assert "job.toml:1:11: profile /dev/zero is larger than 16 MiB" in err


def test_spec_that_never_ends_is_refused(ml):
    err = _refused(ml, "validate", "/dev/zero")
    assert "/dev/zero: cannot read job spec: larger than 16 MiB" in err


@pytest.mark.parametrize("key,value,what", [
    ("timeout", "200000d", "[run] timeout"),
    ("grace_period", "200000d", "[run] grace_period"),
])
def test_durations_past_the_bound_are_located_errors(ml, key, value, what):
    spec = ml.write("job.toml", f'[run]\ncommand = "true"\n{key} = "{value}"\n')
    err = _refused(ml, "run", spec)
    assert f"job.toml:3:" in err and f"{what} 4800000h00m is longer than" in err
    assert not ml.run_dirs()  # refused before anything was recorded


def test_timeout_flag_past_the_bound(ml):
    err = _refused(ml, "run", "--timeout", "200000d", "-n", "1", "--", "true")
    assert "timeout 4800000h00m is longer than" in err


def test_a_million_ranks_is_refused_at_once(ml):
    err = _refused(ml, "validate", "-n", "1000000", "--", "true")
    assert "more than 16384 ranks" in err
    spec = ml.write("job.toml", '[run]\ncommand = "true"\n[cluster]\nnprocs = 1000000\n')
    assert "job.toml:4:10: more than 16384 ranks" in _refused(ml, "validate", spec)


def test_node_list_patterns_past_the_host_bound(ml):
    err = _refused(ml, "validate", "-H", "a[0-65535],b[0-65535],c[0-65535],d[0-65535]", "--", "true")
    assert "262144 hosts; mltrain runs on at most 4096" in err
