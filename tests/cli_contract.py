"""The bad-input contract's helpers: ``fedapt`` run in this process (typer's CliRunner) with
outputs under a temporary folder, and the check that a refusal is one clear line: a non-zero
exit, no traceback, the key or path named, the error last, no new file under the outputs."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from flows.cli import app

REPO = Path(__file__).resolve().parents[1]


runner = CliRunner()


SMALL = ["--set", "data.train_subset=1200", "--set", "data.test_subset=500"]


LOCAL = ["--set", "storage.bucket=null", "--set", "runtime.tracking=false"]


def invoke(tmp_path: Path, command: str, *args: str, root: Path | None = None):
    """``fedapt <command>`` with outputs under tmp_path/reports; ``args`` come last (a later
    --set wins)."""
    reports = ["--set", f"experiment.reports_dir={tmp_path / 'reports'}"]
    data = ["--set", f"data.root={root or REPO / 'data/raw'}"]
    params = ["--params", str(REPO / "params.yaml")]
    return runner.invoke(app, [command, *LOCAL, *SMALL, *params, *data, *reports, *args])


def assert_one_clear_line(res, needle: str, outputs: Path) -> None:
    text = res.output.strip()
    assert res.exit_code != 0, text
    assert "Traceback" not in text, text
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert needle in text, text
    assert text.splitlines()[-1].startswith("fedapt: error: "), text  # the last thing printed
    assert not outputs.exists() or not any(p.is_file() for p in outputs.rglob("*")), text
