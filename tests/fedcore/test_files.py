"""The one atomic write (issue 47: it existed three times and had drifted in its file mode)."""

from __future__ import annotations

import errno
import os
import stat

import pytest

from fedcore import files


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_plain_file_mode_unless_asked_and_no_temp_left(tmp_path):
    old = os.umask(0o022)
    try:
        out = files.atomic_write_text(tmp_path / "a" / "b.json", "x\r\ny")
        assert out.read_bytes() == b"x\r\ny" and _mode(out) == 0o644  # as open() would make it
        secret = files.atomic_write_bytes(tmp_path / "s", b"k", mode=0o600, fsync=True)
        assert _mode(secret) == 0o600
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b.json", "s"]


def test_a_failed_write_names_the_file_and_leaves_nothing(tmp_path, monkeypatch):
    def full(*_):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(files.os, "replace", full)
    with pytest.raises(OSError, match="No space left") as err:
        files.atomic_write_bytes(tmp_path / "m.pt", b"123")
    assert err.value.filename == str(tmp_path / "m.pt")
    assert list(tmp_path.iterdir()) == []
