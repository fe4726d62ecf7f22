"""Behaviour preserved: the same experiments at two revisions give byte-identical outputs.

For a refactor that must not change what fedapt computes (issue 15): each revision is checked
out in a temporary git worktree and runs, with this venv, through the real `fedapt run` flow:

* ``default``: params.yaml as committed (``--rounds N`` shortens it; ``--rounds 0`` keeps its
  own count, the whole default run);
* ``algorithms``: every registered algorithm with adapter ``full``;
* ``adapters``: FedAvg with every adapter method that applies to the default model;
* ``codecs``: FedAvg with full fine-tuning and the first adapter, under every built-in
  update codec (and none);
* ``sweep``: FedAvg/full over two seeds, on a pretrained base.

The grids run on 1,200 training / 500 test images, 2 rounds. Outputs compared byte for byte:
every cell's ``metrics.json`` and ``model.pt`` and the partition manifest (``timing.json``
holds the timings and is left out). Tracking and S3 are off; nothing else differs.

Run:  .venv/bin/python scripts/same_outputs.py BEFORE [AFTER]   (AFTER: the working tree)
      e.g. scripts/same_outputs.py 1994319 HEAD
Exit 0 when every compared file is identical, 1 otherwise (the differing files are listed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FEDAPT = [sys.executable, "-m", "flows.cli"]
COMMON = ["runtime.tracking=false", "storage.bucket=null"]
SMALL = ["data.train_subset=1200", "data.test_subset=500", "federation.rounds=2"]


NAMES = """
import json
from fedcore.algorithms import list_algorithms
from models import get_model
from fedcore.codecs import BUILTIN
from models.adapters import get_adapter, list_adapters
from tasks.config import load_params

p = load_params("params.yaml", [])
model = get_model(p.model.name, num_classes=10, in_channels=1, input_size=28)
adapters = [a for a in list_adapters() if get_adapter(a).applies_to(model) is None]
print(json.dumps([list_algorithms(), adapters, list(BUILTIN)]))
"""


def names(tree: Path) -> tuple[list[str], list[str], list[str]]:
    """The algorithms, the adapters that apply to the default model and the built-in update
    codecs at ``tree``."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run(
        [sys.executable, "-c", NAMES], cwd=tree, env=env, capture_output=True, text=True, check=True
    ).stdout
    algorithms, adapters, codecs = json.loads(out.splitlines()[-1])
    return algorithms, adapters, codecs


def grids(algorithms: list[str], adapters: list[str], codecs: list[str]) -> dict[str, list[str]]:
    frozen = [a for a in adapters if a != "full"][:1]
    return {
        "algorithms": [f"grid.algorithms=[{','.join(algorithms)}]", "grid.adapters=[full]"],
        "adapters": ["grid.algorithms=[fedavg]", f"grid.adapters=[{','.join(adapters)}]"],
        "codecs": [
            "grid.algorithms=[fedavg]",
            f"grid.adapters=[{','.join(['full', *frozen])}]",
            f"grid.codecs=[{','.join(dict.fromkeys(['none', *codecs]))}]",
        ],
        "sweep": [
            "grid.algorithms=[fedavg]",
            "grid.adapters=[full]",
            "experiment.seeds=[0,1]",
            "model.base=pretrain",
        ],
    }


def run_at(
    tree: Path, out: Path, rounds: int, common: tuple[list[str], list[str], list[str]]
) -> dict[str, str]:
    """sha256 of every compared output of the three experiments run in ``tree``; ``common``:
    the algorithms and adapters both revisions have."""
    runs = {"default": [f"federation.rounds={rounds}"] if rounds else []}
    runs |= {name: SMALL + sets for name, sets in grids(*common).items()}
    env = {**os.environ, "PYTHONPATH": str(tree)}
    # The revision's own code runs, not the editable install of this checkout.
    where = subprocess.run(
        [sys.executable, "-c", "import fedcore, flows.cli; print(fedcore.__file__, flows.cli.__file__)"],
        cwd=tree, env=env, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not all(Path(w).resolve().is_relative_to(tree.resolve()) for w in where):
        sys.exit(f"{tree}: imports resolve outside the worktree: {where}")
    digests: dict[str, str] = {}
    for name, sets in runs.items():
        args = [f"experiment.reports_dir={out}", f"experiment.name={name}", *COMMON, *sets]
        cmd = [*FEDAPT, "run", "--params", str(tree / "params.yaml")]
        for s in args:
            cmd += ["--set", s]
        print(f"[{tree.name}] {name}: fedapt run {' '.join(args)}", flush=True)
        res = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            sys.exit(f"{tree}: {name} failed:\n{res.stdout[-2000:]}\n{res.stderr[-2000:]}")
        for f in sorted((out / name).rglob("*")):
            if f.name in ("metrics.json", "model.pt", "manifest.csv", "base.pt"):
                rel = str(f.relative_to(out))
                digests[rel] = hashlib.sha256(f.read_bytes()).hexdigest()
    return digests


def worktree(rev: str, where: Path) -> Path:
    subprocess.run(
        ["git", "worktree", "add", "--detach", "-q", str(where), rev], cwd=ROOT, check=True
    )
    (where / "data").symlink_to(ROOT / "data")  # the embedded dataset (not in git)
    return where


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", help="a revision (default: the working tree)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of the default run (0: all)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="same-outputs-") as tmp:
        t = Path(tmp)
        trees = [worktree(args.before, t / "before")]
        trees.append(worktree(args.after, t / "after") if args.after else ROOT)
        try:
            before, after = names(trees[0]), names(trees[1])
            alg, ad, cod = ([x for x in a if x in b] for a, b in zip(before, after, strict=True))
            common = (alg, ad, cod)
            new = sorted(x for a, b in zip(before, after, strict=True) for x in set(b) - set(a))
            if new:  # nothing to compare them with
                print(f"only in {args.after or 'the working tree'} (not compared): {new}")
            a, b = (
                run_at(tree, t / f"out-{i}", args.rounds, common) for i, tree in enumerate(trees)
            )
        finally:
            for tree in trees:
                if tree != ROOT:
                    subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT)
    differ = sorted(k for k in a.keys() | b.keys() if a.get(k) != b.get(k))
    print(f"{len(a)} outputs compared; {len(differ)} differ")
    for k in differ:
        print(f"  differs: {k}")
    sys.exit(1 if differ or not a else 0)


if __name__ == "__main__":
    main()
