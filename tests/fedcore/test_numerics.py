"""Numerics modes (fedcore/numerics.py): portable runs give the same bytes on every x86-64 CPU
with AVX2, native runs may not.

Two CPUs are emulated on this one: the machine as it is, and the same machine with every
library that dispatches on the instruction set capped at AVX2 (ATen, oneDNN, MKL), the way an
AVX2-only CPU would run them. A short real run of the default experiment (the DVC train stage,
``fedapt train``) on both must give identical ``metrics.json`` and ``model.pt`` in portable
mode, and must differ in native mode (so the comparison can fail). Both engines are in what is
compared: the sequential engine with a client worker process, and the cohort engine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fedcore import numerics
from fedcore.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
FEDAPT = [sys.executable, "-m", "flows.cli"]
# What an AVX2-only CPU would run: each library's dispatch capped at AVX2.
AVX2_CPU = {
    "ATEN_CPU_CAPABILITY": "avx2",
    "DNNL_MAX_CPU_ISA": "AVX2",
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",
}
SHORT = [  # the default experiment of params.yaml, shortened
    "data.train_subset=2000",
    "data.test_subset=1000",
    "federation.rounds=2",
    "runtime.tracking=false",
    f"data.root={ROOT / 'data/raw'}",
]


def _clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the numerics settings it runs under (the suite is
    portable, tests/conftest.py), plus ``extra``: a new process on a new machine."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in numerics.PORTABLE_ENV
        and k not in (numerics.MODE_VAR, numerics.THREADS_VAR)
        and k not in AVX2_CPU
    }
    env["PYTHONPATH"] = str(ROOT)
    return env | (extra or {})


def test_unknown_mode_is_one_line_naming_the_allowed_values():
    with pytest.raises(
        ConfigError, match=r"runtime.numerics: 'fast' is not one of portable, native"
    ):
        numerics.apply("fast")
    with pytest.raises(ConfigError, match="runtime.threads"):
        numerics.resolve_threads("portable", 0)
    assert numerics.resolve_threads("portable") == numerics.PORTABLE_THREADS
    assert numerics.resolve_threads("native") is None
    assert numerics.resolve_threads("native", 3) == 3


def test_this_suite_computes_portably():
    import torch

    numerics.apply("portable")  # in force since conftest: asking again is a no-op
    prov = numerics.provenance()
    assert prov["numerics"] == "portable"
    assert prov["aten_capability"] == "AVX2" == torch.backends.cpu.get_cpu_capability()
    assert prov["onednn_enabled"] is False and prov["nnpack_enabled"] is False
    if prov["mkl"] is not None:
        assert prov["mkl_cbwr"] == "COMPATIBLE"
    assert prov["threads"] == numerics.PORTABLE_THREADS
    with pytest.raises(numerics.NumericsError, match="native was asked for in a process"):
        numerics.apply("native")


def test_portable_after_torch_computed_natively_is_refused_in_one_line():
    code = (
        "import torch; torch.ones(3).exp()\n"
        "from fedcore import numerics\n"
        "try:\n    numerics.apply('portable')\n"
        "except numerics.NumericsError as e:\n    print('refused:', e)\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code], env=_clean_env(), capture_output=True, text=True, check=True
    )
    line = r.stdout.strip()
    if numerics.cpu_isa() in ("AVX", "SSE"):
        assert "needs an x86-64 CPU with AVX2" in line
    else:
        assert line.startswith("refused: runtime.numerics: portable, but torch already computed")


def test_a_bad_mode_on_the_command_line_is_one_line(tmp_path):
    r = subprocess.run(
        [*FEDAPT, "partition", "--out", str(tmp_path / "p"), "--set", "runtime.numerics=fast"],
        cwd=ROOT,
        env=_clean_env(),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "runtime.numerics" in lines[0] and "portable" in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "p").exists()


def _fedapt(args: list[str], cwd: Path, env: dict[str, str]) -> None:
    r = subprocess.run([*FEDAPT, *args], cwd=cwd, env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]


def _train(tmp: Path, name: str, mode: str, cpu: dict[str, str], engine: list[str]) -> Path:
    out = tmp / name
    sets = [*SHORT, f"runtime.numerics={mode}", *engine]
    args = ["train", "--algorithm", "fedavg", "--partition", str(tmp / "part")]
    args += ["--out", str(out), "--timing", str(tmp / f"timing-{name}")]
    args += [a for s in sets for a in ("--set", s)]
    _fedapt(args, tmp, _clean_env(cpu))
    return out


def _same(a: Path, b: Path) -> bool:
    return all((a / f).read_bytes() == (b / f).read_bytes() for f in ("metrics.json", "model.pt"))


@pytest.mark.slow
def test_portable_runs_are_byte_identical_on_two_emulated_cpus_native_runs_are_not(tmp_path):
    if numerics.cpu_isa() not in ("AVX512", "AVX512-AMX"):
        pytest.skip(f"emulating a second CPU needs one above AVX2 (this one: {numerics.cpu_isa()})")
    sets = [a for s in SHORT for a in ("--set", s)]
    _fedapt(["partition", "--out", str(tmp_path / "part"), *sets], tmp_path, _clean_env())
    _fedapt(["validate", "--partition", str(tmp_path / "part"), *sets], tmp_path, _clean_env())
    engines = {
        "worker": ["runtime.engine=sequential", "runtime.workers=1"],  # a client worker process
        "cohort": ["runtime.engine=cohort", "runtime.workers=0"],
    }
    for engine, how in engines.items():
        runs = {
            (mode, cpu): _train(tmp_path, f"{engine}-{mode}-{cpu}", mode, env, how)
            for mode in ("portable", "native")
            for cpu, env in (("full", {}), ("avx2", AVX2_CPU))
        }
        assert _same(runs["portable", "full"], runs["portable", "avx2"]), engine
        assert not _same(runs["native", "full"], runs["native", "avx2"]), engine
        # where each came from is recorded beside the hashed outputs, not in them
        prov = json.loads(
            (tmp_path / f"timing-{engine}-portable-avx2" / "fedavg-full.json").read_text()
        )
        assert prov["provenance"]["numerics"] == "portable"
        assert prov["provenance"]["aten_capability"] == "AVX2"
        native = json.loads(
            (tmp_path / f"timing-{engine}-native-full" / "fedavg-full.json").read_text()
        )
        assert native["provenance"]["aten_capability"] == "AVX512"
        metrics = json.loads((runs["portable", "full"] / "metrics.json").read_text())
        assert metrics["numerics"] == "portable" and "provenance" not in metrics


def test_auto_is_the_entry_points_promise_unless_the_process_already_runs_a_mode(monkeypatch):
    monkeypatch.delenv(numerics.MODE_VAR, raising=False)
    assert numerics.resolve("auto", "portable") == "portable"  # dvc stages, fedapt reproduce
    assert numerics.resolve("auto", "native") == "native"  # fedapt run, deployments
    assert numerics.resolve("native", "portable") == "native"  # an explicit mode wins
    monkeypatch.setenv(numerics.MODE_VAR, "portable")  # a portable parent, or your shell
    assert numerics.resolve("auto", "native") == "portable"
    with pytest.raises(ConfigError, match="not one of auto, portable, native"):
        numerics.resolve("exact", "native")


def test_params_name_the_resolved_mode(monkeypatch):
    from tasks.config import load_params, resolved

    monkeypatch.delenv(numerics.MODE_VAR, raising=False)
    p = load_params(ROOT / "params.yaml")
    assert p.runtime.numerics == "auto"
    assert resolved(p, "portable").runtime.numerics == "portable"
    assert resolved(p, "portable").flat()["runtime.numerics"] == "portable"
    q = load_params(ROOT / "params.yaml", ["runtime.numerics=native"])
    assert resolved(q, "portable") is q


def test_mlflow_runs_are_tagged_with_where_their_numbers_came_from():
    from tasks.tracking import provenance_tags

    tags = provenance_tags()
    assert tags["fedapt.numerics"] == "portable"
    assert tags["fedapt.aten_capability"] == "AVX2"
    assert tags["fedapt.cpu_isa"] == numerics.cpu_isa()
    assert tags["fedapt.threads"] == str(numerics.PORTABLE_THREADS)
    assert {"fedapt.cpu", "fedapt.torch", "fedapt.mkl", "fedapt.mkl_cbwr"} <= set(tags)
    assert all(isinstance(v, str) for v in tags.values())  # MLflow tags are strings


def test_native_under_inherited_portable_settings(tmp_path):
    """FEDAPT_NUMERICS=portable in the environment (a shell, or a portable parent) and an
    explicit native run: native, as asked, unless torch already computed under the inherited
    settings, which is refused in one line."""
    code = (
        "import sys, torch\n"
        "if sys.argv[1] == 'computed': torch.ones(3).exp()\n"
        "from fedcore import numerics\n"
        "try:\n    numerics.apply('native')\n"
        "except numerics.NumericsError as e:\n    print('refused:', e); raise SystemExit\n"
        "print(numerics.provenance()['aten_capability'], numerics.provenance()['mkl_cbwr'])\n"
    )
    env = _clean_env({numerics.MODE_VAR: "portable", **numerics.PORTABLE_ENV})
    runs = {
        how: subprocess.run(
            [sys.executable, "-c", code, how], env=env, capture_output=True, text=True, check=True
        ).stdout.strip()
        for how in ("fresh", "computed")
    }
    if numerics.cpu_isa() in ("AVX512", "AVX512-AMX"):
        assert runs["fresh"].startswith("AVX512 "), runs
        assert runs["computed"].startswith("refused: runtime.numerics: native, but torch"), runs
    assert "COMPATIBLE" not in runs["fresh"], runs
