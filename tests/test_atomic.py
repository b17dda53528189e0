"""atomic_write: the user's umask decides the permissions (not mkstemp's 0600), the bytes are on disk
before the rename, and a failed write leaves the old file and no temporary one."""

import os
import stat

import pytest
from support.numpy_bert import write_tiny_bert

import specbound
import specbound.atomic
from specbound.atomic import atomic_write


@pytest.fixture
def umask():
    old = os.umask(0o022)
    os.umask(old)

    def set_(mask):
        os.umask(mask)

    yield set_
    os.umask(old)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600), (0o027, 0o640)])
def test_mode_follows_the_umask(tmp_path, umask, mask, mode):
    umask(mask)
    path = atomic_write(tmp_path / "f.txt", lambda p: open(p, "w").write("x"))
    assert stat.S_IMODE(path.stat().st_mode) == mode
    # and as a file opened for writing would have it
    plain = tmp_path / "plain.txt"
    plain.write_text("x")
    assert stat.S_IMODE(plain.stat().st_mode) == mode


def test_file_and_folder_are_fsynced_before_and_after_the_rename(tmp_path, monkeypatch):
    synced = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(
        specbound.atomic.os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or real_fsync(fd)
    )
    monkeypatch.setattr(specbound.atomic.os, "replace", lambda a, b: synced.append("rename") or real_replace(a, b))
    target = tmp_path / "t.json"
    atomic_write(target, lambda p: open(p, "w").write("{}"))
    assert len(synced) == 3 and synced[1] == "rename"
    assert os.path.basename(synced[0]).startswith(".t.json.") and synced[2] == str(tmp_path)


def test_a_failed_write_keeps_the_old_file(tmp_path):
    target = tmp_path / "t.txt"
    target.write_text("old")

    def fail(p):
        open(p, "w").write("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        atomic_write(target, fail)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["t.txt"]


def test_saved_analysis_tables_follow_the_umask(tmp_path, umask):
    umask(0o002)
    folder = write_tiny_bert(tmp_path / "m", seed=0)
    for path in specbound.analyze(folder, threads=1).save(tmp_path / "out"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o664, path
