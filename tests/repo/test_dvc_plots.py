"""`dvc plots show` in this repository: no warning (the reproduce pipeline declares no
plots), a page that loads no remote script (vendor/vega/dvc-plots.html inlines vega), charts
that render without a network, and its output folder git-ignored."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DVC = str(Path(sys.executable).parent / "dvc")


def plots_show(out: Path, *targets: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DO_NOT_TRACK": "true"}
    return subprocess.run(
        [DVC, "plots", "show", *targets, "-o", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dvc_plots")
    res = plots_show(out)
    assert res.returncode == 0, res.stdout + res.stderr
    # only the page's address: no "DVC failed to load some plots", no other warning
    assert res.stderr == "" and res.stdout.strip() == (out / "index.html").as_uri()
    return out / "index.html"


def test_the_page_loads_no_remote_script(page):
    html = page.read_text(encoding="utf8")
    tags = re.findall(r"<script\b[^>]*>", html)
    assert tags and not [t for t in tags if "src" in t], tags  # every script inline
    assert "cdn." not in html
    for package in ("vega@", "vega-lite@", "vega-embed@"):
        assert f"<script>/* {package}" in html
    assert "vegaEmbed('#" in html  # the interactive accuracy-vs-MiB chart of rounds.csv
    for img in re.findall(r"<img\b[^>]*src\s*=\s*\"([^\"]+)\"", html):
        assert not img.startswith(("http:", "https:", "//"))  # the PNG figures, local


@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run vega headless")
def test_the_charts_render_offline(page):
    res = subprocess.run(
        ["node", str(REPO / "tests/repo/render_dvc_plots.js"), str(page)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert re.search(r"chart 1: \d+ bytes of SVG, [1-9]\d* paths", res.stdout), res.stdout
    assert "vegaEmbed defined: function" in res.stdout


def test_dvc_plots_folder_is_ignored():
    res = subprocess.run(
        ["git", "check-ignore", "-q", "dvc_plots/index.html"], cwd=REPO, check=False
    )
    assert res.returncode == 0
