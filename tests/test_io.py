"""Atomic writes: a failed write leaves the previous file intact and no temp file behind."""

import pytest

from ppmulti.common.atomic import atomic_save, atomic_write_text


def test_atomic_write_replaces(tmp_path):
    p = tmp_path / "a.txt"
    atomic_write_text(p, "one")
    atomic_write_text(p, "two")
    assert p.read_text() == "two"
    assert [x.name for x in tmp_path.iterdir()] == ["a.txt"]


def test_crash_during_write_keeps_old_file(tmp_path):
    p = tmp_path / "ckpt.bin"
    atomic_write_text(p, "good")

    def writer(tmp):
        with open(tmp, "w") as f:
            f.write("half")
        raise KeyboardInterrupt  # the process dies mid-save

    with pytest.raises(KeyboardInterrupt):
        atomic_save(p, writer)
    assert p.read_text() == "good"
    assert [x.name for x in tmp_path.iterdir()] == ["ckpt.bin"]
