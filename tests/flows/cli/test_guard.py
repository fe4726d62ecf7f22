"""The CLI's guard (flows.cli.guards.guard): an error is one plain-text line, an OSError names
its path, a full disk names the file or the setting whose folder filled and leaves no
partial file."""

from __future__ import annotations

import errno

import pytest

from fedcore.errors import ConfigError
from tests.cli_contract import assert_one_clear_line, invoke


def test_guard_prints_plain_text_and_names_the_path_of_an_os_error(capsys):
    """Error text is never Rich markup; an OSError at the edges is one line with its path."""
    import typer

    from flows.cli.guards import guard

    def fail(exc: BaseException):
        def body():
            raise exc

        return body

    for exc, needle in (
        (ConfigError("value a[/x] and [full] here"), "value a[/x] and [full] here"),
        (NotADirectoryError(20, "Not a directory", "/tmp/a-file/out"), "/tmp/a-file/out: Not a"),
        (PermissionError(13, "Permission denied", "/root/x"), "/root/x: Permission denied"),
    ):
        with pytest.raises(typer.Exit) as code:
            guard(fail(exc))
        err = capsys.readouterr().err
        assert code.value.exit_code == 2 and needle in err and "Traceback" not in err, err
        assert err.startswith("fedapt: error: ") and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("writer", ["checkpoint", "manifest"])
def test_full_disk_is_one_line_and_leaves_no_partial_file(tmp_path, monkeypatch, capsys, writer):
    """ENOSPC while an output is written (a checkpoint after minutes of training, a manifest):
    one line naming the file, exit 2, neither the file nor its temp file left behind."""
    import os

    import typer

    from fedcore.files import atomic_write_text
    from flows.cli.guards import guard
    from tasks.io import atomic_write_bytes

    real_fdopen = os.fdopen

    class Full:
        def __init__(self, fh):
            self.fh = fh

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.fh.close()

        def write(self, data):
            self.fh.write(data[:10])  # a part reached the disk, then it was full
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", lambda fd, *a, **k: Full(real_fdopen(fd, *a, **k)))
    target = tmp_path / "out" / ("fedavg-full.pt" if writer == "checkpoint" else "manifest.csv")
    target.parent.mkdir()

    def body() -> None:
        if writer == "checkpoint":  # tasks/training/checkpoint.py writes through atomic_write_bytes
            atomic_write_bytes(target, b"x" * 4096)
        else:
            atomic_write_text(target, "client_id,sample_index,label\n" * 100)

    with pytest.raises(typer.Exit) as code:
        guard(body)
    err = capsys.readouterr().err
    assert code.value.exit_code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedapt: error: "), err
    assert f"{target}: No space left on device; free some space" in err, err
    assert list(target.parent.iterdir()) == [], "a partial output or temp file was left"


@pytest.mark.parametrize("case", ["partition", "state-dir", "no-file-named"])
def test_full_disk_names_the_setting_whose_folder_filled(tmp_path, monkeypatch, capsys, case):
    """ENOSPC at a file under a setting's folder: the line names the setting, its value and
    the file, and says to free space; exit 2, no traceback, nothing left (issue 45: it named
    the file only). An OSError of a write that names no file: the settings' folders."""
    import os

    import typer

    from flows import settings
    from flows.cli.guards import guard

    real_fdopen = os.fdopen

    def full(fd, *args, **kwargs):
        real_fdopen(fd, *args, **kwargs).close()
        raise OSError(errno.ENOSPC, "No space left on device")

    reports = tmp_path / "reports"
    if case == "partition":  # `fedapt partition` writes manifest.csv atomically (os.fdopen)
        monkeypatch.setattr(os, "fdopen", full)
        res = invoke(tmp_path, "partition")
        manifest = reports / "fmnist-dir05-fedavg" / "partition" / "manifest.csv"
        needle = (
            f"experiment.reports_dir: {reports}: No space left on device at "
            f"{settings.shorten(str(manifest))}; "
            "free some space there (or raise the quota) and run again"
        )
        assert_one_clear_line(res, needle, reports)
        return
    state = tmp_path / "state"
    settings.forget()
    settings.setting_path("FEDAPT_STATE_DIR", str(state), state, "a folder")
    settings.setting_path("experiment.reports_dir", str(reports), reports / "exp", "a folder")

    def body() -> None:
        if case == "state-dir":
            raise OSError(errno.ENOSPC, "No space left on device", str(state / "logs/x.log"))
        raise OSError(errno.EDQUOT, "Disk quota exceeded")  # a write() names no file

    try:
        with pytest.raises(typer.Exit) as code:
            guard(body)
    finally:
        settings.forget()
    err = capsys.readouterr().err
    assert code.value.exit_code == 2 and "Traceback" not in err, err
    assert len(err.strip().splitlines()) == 1 and err.startswith("fedapt: error: "), err
    if case == "state-dir":
        assert err.strip() == (
            f"fedapt: error: FEDAPT_STATE_DIR: {state}: No space left on device at "
            f"{state / 'logs/x.log'}; free some space there (or raise the quota) and run again"
        )
    else:
        assert err.strip() == (
            "fedapt: error: Disk quota exceeded; free some space (or raise the quota) on the "
            f"disk of FEDAPT_STATE_DIR ({state}), experiment.reports_dir ({reports / 'exp'}), "
            "then run again"
        )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["run", "--bogus"], "run: No such option: --bogus (see `fedapt run --help`)"),
        (["run", "--device"], "run: Option '--device' requires an argument."),
        (["deploy", "ls", "--x"], "deploy ls: No such option: --x"),
        (["deploy", "pause"], "deploy pause: Missing argument 'name'."),
        (["status", "extra"], "status: Got unexpected extra argument(s) (extra)"),
        (["nosuch"], "No such command 'nosuch'."),
        (["--zzz"], "No such option: --zzz (see `fedapt --help`)"),
        (["partition", "--out", ""], "partition: --out is empty; give it a value"),
        (["partition", "--out="], "partition: --out is empty; give it a value"),
        (["train", "--partition", ""], "train: --partition is empty"),
        (["deploy", "pause", ""], "deploy pause: an empty argument"),
    ],
)
def test_a_usage_error_is_one_line_naming_the_command(args, needle, tmp_path, monkeypatch):
    """Click's usage errors (unknown option or command, a missing value or argument, an extra
    argument), from any command or subgroup, are the one line every refusal is: no usage
    block, no framed box, exit 2. An empty value is one too (an empty --out was read as the
    current folder, and written into)."""
    monkeypatch.chdir(tmp_path)
    from typer.testing import CliRunner

    from flows.cli import app

    res = CliRunner().invoke(app, args, prog_name="fedapt")
    text = res.output.strip()
    assert res.exit_code == 2, text
    assert text == f"fedapt: error: {needle}" or (
        text.startswith(f"fedapt: error: {needle}") and len(text.splitlines()) == 1
    ), text
    assert "Usage:" not in text and "╭" not in text, text
    assert not any(tmp_path.iterdir())  # nothing written where the command ran
