"""What a user sees in the UIs after `make run` (issue 46), in a real browser: Debian's
chromium (``scripts/get-browser.sh``) driven by Playwright, a fresh profile, against the
MLflow and Prefect servers of ``fedapt up`` (on free ports of 127.0.0.1) and a small
`fedapt run`:

- each line the run prints appears once, MLflow's own "View run" lines not among them;
- the MLflow link it prints opens the training view's Runs table, one row per cell, with
  the result columns (final and last-L accuracy in %, L, MiB up and down, rounds);
- the Prefect link it prints opens the flow run, whose Task Runs tab lists every task run
  (no "Invalid TaskInputResponse": no task gets a subflow's return value).

Slow (servers and a run, about a minute and a half on 2 busy cores); it fails, never skips,
when chromium is missing."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from flows import services as S
from tasks.tracking.views import home_url

REPO = Path(__file__).resolve().parents[3]
CHROMIUM = Path("/usr/bin/chromium")
CELLS = ("fedavg-full", "fedprox-full")
COLUMNS = (
    "final_accuracy_pct",
    "mean_accuracy_last_L_pct",
    "last_rounds_L",
    "upload_mib",
    "download_mib",
    "federation.rounds",
)
WIDE = {"width": 2400, "height": 1000}
TASKS = (
    "start-tracking",
    "partition",
    "validate-shards",
    "summary",
    "results-artifact",
    "log-results",
    "end-tracking",
)


def _launch(playwright):  # type: ignore[no-untyped-def]
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: run `make setup` or `sudo apt-get install -y chromium`"
        )
    args = ["--no-sandbox"] if os.geteuid() == 0 else []  # chromium refuses root otherwise
    return playwright.chromium.launch(executable_path=str(CHROMIUM), args=args)


@pytest.mark.slow
def test_printed_links_open_the_runs_table_and_every_task_run(tmp_path):
    from playwright.sync_api import sync_playwright

    sd = tmp_path / "state"
    try:
        S.up(["mlflow", "prefect"], state=sd, ports={"s3": 0, "mlflow": 0, "prefect": 0})
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "PREFECT_", "AWS_"))
        }
        env["FEDAPT_STATE_DIR"] = str(sd)  # `fedapt run` finds the services, as after `fedapt up`
        sets = [
            f"experiment.reports_dir={tmp_path / 'reports'}",
            "experiment.name=browser",
            f"data.root={REPO / 'data/raw'}",
            "data.train_subset=400",
            "data.test_subset=100",
            "partition.num_clients=4",
            "federation.rounds=2",
            "client.max_steps=2",
            f"grid.algorithms=[{','.join(c.split('-')[0] for c in CELLS)}]",
            "runtime.workers=0",
            "storage.bucket=null",
        ]
        args = [sys.executable, "-m", "flows.cli", "run", "--params", str(REPO / "params.yaml")]
        for s in sets:
            args += ["--set", s]
        proc = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
        printed = proc.stdout + proc.stderr
        assert proc.returncode == 0, printed[-3000:]

        # Output once: no line twice, MLflow's own links not at all
        lines = [line for line in printed.splitlines() if line.strip()]
        assert not [line for line in set(lines) if lines.count(line) > 1], printed
        assert "View run" not in printed and "View experiment" not in printed
        (mlflow_link,) = [
            line.removeprefix("MLflow: ") for line in lines if line.startswith("MLflow: http")
        ]
        flow_run_link = re.search(r"View at (http\S+/runs/flow-run/\S+)", proc.stderr)
        assert flow_run_link, proc.stderr[-3000:]

        api = S.env_for_clients(sd)["PREFECT_API_URL"]
        env["MLFLOW_TRACKING_URI"] = S.env_for_clients(sd)["MLFLOW_TRACKING_URI"]
        (artifact,) = _filter(api, "artifacts", {"key": {"any_": ["fedapt-browser"]}})
        # the results artifact links the same table, and each cell's run in the same view
        links = re.findall(r"\]\((http[^)]+)\)", artifact["data"])
        assert mlflow_link in links and len(links) == len(CELLS) + 1, artifact["data"]
        assert all("workflowType=machine_learning" in link for link in links), links

        # the training subflow's own flow run: its Task Runs tab lists one train task a cell
        (training,) = _filter(api, "flow_runs", {"name": {"any_": ["fedapt-train-grid"]}}, "flows")
        training_link = re.sub(r"[^/]+$", training["id"], flow_run_link.group(1))

        with sync_playwright() as playwright:
            browser = _launch(playwright)
            try:
                # wide: the grid draws only the columns in view (MLflow's assistant panel beside)
                mlflow_page(browser.new_context(viewport=WIDE), mlflow_link)
                home_page(browser.new_context(), home_url(env["MLFLOW_TRACKING_URI"]))
                prefect_page(browser.new_context(), flow_run_link.group(1))
                prefect_page(
                    browser.new_context(),
                    training_link,
                    {rf"^train-{cell}$" for cell in CELLS},
                )
            finally:
                browser.close()
    finally:
        S.down(state=sd)


def _filter(api: str, what: str, where: dict, of: str | None = None) -> list[dict]:
    """Prefect's ``POST /<what>/filter``, ``where`` on ``of`` (default: ``what`` itself)."""
    request = urllib.request.Request(
        f"{api}/{what}/filter",
        data=json.dumps({of or what: where}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=30) as resp:
        return json.load(resp)  # type: ignore[no-any-return]


def mlflow_page(context, link: str) -> None:  # type: ignore[no-untyped-def]
    """A fresh profile (nothing in localStorage) lands on the Runs table of the training
    view: the cells as rows, the result columns shown."""
    page = context.new_page()
    page.goto(link)
    for column in COLUMNS:  # (the table draws once the runs and the view are read)
        page.get_by_role("columnheader", name=column, exact=True).first.wait_for(timeout=60_000)
    for cell in CELLS:
        page.get_by_role("link", name=cell, exact=True).wait_for(timeout=60_000)
    rows = page.get_by_role("row").all_inner_texts()
    assert all(any(cell in row for row in rows) for cell in CELLS), rows
    assert not any("browser 20" in row for row in rows), rows  # the parent: no empty row
    assert "2 matching runs" in page.locator("body").inner_text()
    assert page.get_by_role("link", name="Models").first.is_visible()  # not the GenAI view
    stored = page.evaluate("() => Object.assign({}, window.localStorage)")
    assert stored.get("mlflow.workflowType") in (None, '"machine_learning"'), stored
    assert "workflowType=machine_learning" in page.url


_LOOK = """label => { const e = Array.from(document.querySelectorAll('span')).find(
    s => s.textContent.trim() === label); const c = getComputedStyle(e);
    return [c.color, c.fontWeight].join(' '); }"""


def home_page(context, link: str) -> None:  # type: ignore[no-untyped-def]
    """The MLflow link `fedapt up` prints opens the experiments list in the training view. A
    fresh profile opens MLflow's own root in the GenAI view: there the view switch shows
    "GenAI" as chosen; the printed link shows "Model training" chosen, drawn as "GenAI" is
    at the root (the switch's only cue is its look)."""
    look = {}
    for url in (link.split("?")[0], link):
        page = context.new_page()
        page.goto(url)
        page.get_by_role("link", name="browser", exact=True).first.wait_for(timeout=60_000)
        look[url] = {label: page.evaluate(_LOOK, label) for label in ("GenAI", "Model training")}
        page.close()
    root, printed = look[link.split("?")[0]], look[link]
    assert root["GenAI"] != root["Model training"], root  # the switch shows a choice
    assert printed["Model training"] == root["GenAI"], look  # the training view, chosen
    assert printed["GenAI"] == root["Model training"], look
    assert "workflowType=machine_learning" in link


def prefect_page(context, link: str, tasks: set[str] | None = None) -> None:  # type: ignore[no-untyped-def]
    """The flow run's Task Runs tab lists every task run of the flow run (``tasks``: their
    names' patterns; the experiment flow's by default)."""
    tasks = tasks or {rf"^{name}-\w+$" for name in TASKS}
    page = context.new_page()
    console: list[str] = []
    page.on("console", lambda msg: console.append(msg.text))
    page.goto(link)
    page.get_by_text("Task Runs", exact=True).first.click()
    for pattern in sorted(tasks):
        page.get_by_text(re.compile(pattern)).first.wait_for(timeout=60_000)
    text = page.locator("body").inner_text()
    assert "No task runs" not in text
    assert f"{len(tasks)} Task run" in text, text[:2000]
    assert not [m for m in console if "Invalid TaskInputResponse" in m], console
