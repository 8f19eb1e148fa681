"""Issue 31, reviewed: more names a hostile host may send in a pull that must land only as plain
files below the destination (tests/e2e/hostile_agent.py plays the host)."""
import os

from test_adversarial_pull import a_run, hostile, tree


def test_names_that_collide_with_each_other_are_refused_and_a_failed_cp_places_nothing(ml):
    a_run(ml)
    dest = ml.dir / "d"
    dest.mkdir()
    outside = sorted(os.listdir(ml.dir))
    r = ml("cp", "latest:outputs/", dest / "got", env=hostile("pull-collide"), timeout=60)
    assert r.returncode == 1, r.stderr
    assert "x/y: a folder on its way is a link or a file" in r.stderr, r.stderr
    assert "z: Is a directory" in r.stderr, r.stderr
    assert os.listdir(dest) == [] and sorted(os.listdir(ml.dir)) == outside


def test_data_for_a_file_never_opened_and_bytes_past_a_files_size_are_dropped(ml):
    a_run(ml)
    dest = ml.dir / "d"
    dest.mkdir()
    r = ml("cp", "latest:outputs/", dest / "got", env=hostile("pull-unopened"), timeout=60)
    assert r.returncode == 0, r.stderr
    assert tree(dest) == ["got", "got/ok.txt"] and (dest / "got" / "ok.txt").read_bytes() == b"ok\n"


def test_odd_bytes_and_a_name_max_name_land_as_they_are_and_nothing_raw_is_printed(ml):
    a_run(ml)
    dest = ml.dir / "d"
    dest.mkdir()
    r = ml("cp", "latest:outputs/", dest / "got", env=hostile("pull-oddnames"), timeout=60, text=False)
    assert r.returncode == 0, r.stderr
    names = sorted(os.listdir(os.fsencode(dest / "got")))
    assert names == sorted([b"odd\nname\x01\xff", b"m" * 255]), names
    assert b"\x01" not in r.stderr and b"\xff" not in r.stderr, r.stderr
