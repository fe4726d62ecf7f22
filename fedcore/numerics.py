"""Numerics modes: which CPU kernels compute a run, so that its bytes do not depend on the CPU.

PyTorch picks CPU kernels by the instruction set it finds (ATen's vectorised code, oneDNN's
JIT convolutions, NNPACK, MKL's GEMM), and those kernels round differently: the same seed gives
84.06% on one x86-64 machine and 84.18% on another. Two modes (``runtime.numerics``):

``portable``
    Every ISA-, vendor- and thread-dependent choice is pinned, so that a run gives the same
    bytes on any x86-64 CPU with AVX2 (Intel since Haswell, 2013; AMD since Excavator, 2015,
    and every Zen):

    * ATen's vectorised kernels at AVX2 (``ATEN_CPU_CAPABILITY=avx2``): AVX-512 is absent from
      most AMD CPUs before Zen 4 and from Intel's client CPUs since Alder Lake; no vectorisation
      at all costs a further ~15% on the W1 step (docs/numerics.md);
    * oneDNN (``torch.backends.mkldnn``) and NNPACK off: their kernels are deterministic only on
      one platform (oneDNN's own guarantee), and their blocking follows the CPU's cache sizes, so
      convolutions go through ATen's im2col + GEMM;
    * MKL's Conditional Numerical Reproducibility on its ``COMPATIBLE`` branch
      (``MKL_CBWR=COMPATIBLE``), the one branch MKL documents as giving the same results on
      Intel and non-Intel CPUs (on an AMD CPU ``MKL_CBWR=AVX2`` silently runs MKL's AUTO branch,
      measured);
    * a fixed number of intra-op threads (``runtime.threads``; results depend on it).

``native``
    Whatever the machine's libraries pick: fastest, and exact only on the machine (and thread
    count) that ran it.

The settings must be in force before the first CPU kernel of the process runs: ATen reads its
capability and MKL its branch once, at their first call. :func:`apply` sets them (the
environment variables, inherited by every process started afterwards: client workers, Dask and
Ray workers of a local cluster, DVC stages, runs of a Prefect worker started from such a
process) and then checks that torch really computes that way; a process in which torch already
computed under other settings cannot switch, and :func:`apply` raises :class:`NumericsError`
instead of running natively. Importing torch is not computing: the checks happen after imports.

Exact means: the same ``metrics.json``, ``model.pt`` and per-client bytes from the same params,
seed, fedapt commit and installed versions (constraints.txt), on any x86-64 Linux CPU with
AVX2. Not covered: other architectures (AArch64 has other kernels entirely), GPUs (cuBLAS and
cuDNN promise run-to-run determinism on one device model at best), other torch/MKL builds.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
from pathlib import Path
from typing import Any

from fedcore.errors import ConfigError, FedaptError

MODES = ("portable", "native")
AUTO = "auto"  # runtime.numerics default: what the entry point promises (see resolve)
PORTABLE_ISA = "AVX2"  # ATen's capability name (torch.backends.cpu.get_cpu_capability())
PORTABLE_THREADS = 2  # runtime.threads: auto in portable mode
MODE_VAR = "FEDAPT_NUMERICS"  # the mode in force, inherited by child processes
_APPLIED: str | None = None  # the mode apply() put in force in this process
THREADS_VAR = "FEDAPT_NUMERICS_THREADS"
PORTABLE_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "COMPATIBLE"}

# MKL's CNR constants (mkl_cbwr.h): the branch query and the branches we name.
_MKL_CBWR_BRANCH = 1
_MKL_BRANCHES = {0: "OFF", 1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 8: "SSE4_2"}
_MKL_BRANCHES |= {9: "AVX", 10: "AVX2", 12: "AVX512", 14: "AVX512_E1"}
_MKL_COMPATIBLE = 3


class NumericsError(FedaptError, RuntimeError):
    """Portable numerics were asked for where they cannot be had (one line for the CLI)."""


def check_mode(mode: str, allowed: tuple[str, ...] = MODES, key: str = "runtime.numerics") -> str:
    if mode not in allowed:
        raise ConfigError(f"{key}: {mode!r} is not one of {', '.join(allowed)}")
    return mode


def resolve(mode: str, default: str) -> str:
    """``runtime.numerics`` as a mode: ``auto`` is the mode this process already runs (set by
    a parent process, or ``FEDAPT_NUMERICS`` in your environment), else ``default``: portable
    where exact reruns are the promise (the DVC stages, ``fedapt reproduce``), native for
    ``fedapt run`` and deployments (docs/numerics.md has the measured cost)."""
    check_mode(mode, (AUTO, *MODES))
    if mode != AUTO:
        return mode
    inherited = os.environ.get(MODE_VAR)
    if inherited is not None:
        return check_mode(inherited, key=MODE_VAR)
    return check_mode(default)


def resolve_threads(mode: str, threads: int | str = "auto") -> int | None:
    """Intra-op threads of a computing process; None: the library's default (native, auto)."""
    if threads == "auto":
        return PORTABLE_THREADS if mode == "portable" else None
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"runtime.threads: {threads!r} is not auto or a number >= 1")
    return threads


def apply(mode: str, threads: int | str = "auto") -> None:
    """Put ``mode`` in force in this process and in the processes it starts from now on.

    Call it after imports and before any computation. Raises :class:`ConfigError` for an
    unknown mode and :class:`NumericsError` where portable numerics cannot be had: a CPU
    without AVX2, or torch already computing in this process under other settings."""
    check_mode(mode)
    n = resolve_threads(mode, threads)
    global _APPLIED
    if mode == "native":
        if _APPLIED == "portable":  # ATen and MKL cannot be un-pinned once pinned
            raise NumericsError(
                "runtime.numerics: native was asked for in a process that already computes "
                "with portable numerics; run it in a new process"
            )
        inherited = os.environ.get(MODE_VAR) == "portable"
        if inherited:  # a portable parent's (or your shell's) settings, not this run's
            for key in PORTABLE_ENV:
                os.environ.pop(key, None)
        os.environ[MODE_VAR] = "native"
        if n is not None:
            os.environ[THREADS_VAR] = str(n)
        else:
            os.environ.pop(THREADS_VAR, None)
        _set_threads(n)
        if inherited:
            _check_unpinned()
        _APPLIED = "native"
        return
    os.environ.update(PORTABLE_ENV)
    os.environ[MODE_VAR] = "portable"
    os.environ[THREADS_VAR] = str(n)
    _pin_torch(n)
    _APPLIED = "portable"


def apply_inherited() -> None:
    """In a child process (a client worker): the mode its parent put in force, if any."""
    mode = os.environ.get(MODE_VAR)
    if mode is None:
        return
    threads = os.environ.get(THREADS_VAR)
    apply(mode, int(threads) if threads else "auto")


def mode_in_force() -> str:
    return os.environ.get(MODE_VAR, "native")


def _check_unpinned() -> None:
    """Native after a portable parent: torch must not have computed under its settings."""
    import torch

    cap = torch.backends.cpu.get_cpu_capability()
    pinned = cap == PORTABLE_ISA and cpu_isa() not in (PORTABLE_ISA, "AVX", "SSE")
    if pinned or mkl_branch() == "COMPATIBLE":
        raise NumericsError(
            "runtime.numerics: native, but torch already computed in this process with the "
            "portable settings it inherited (ATEN_CPU_CAPABILITY, MKL_CBWR); run it in a new "
            "process without them"
        )


def _set_threads(n: int | None) -> None:
    if n is None:
        return
    import torch

    torch.set_num_threads(n)


def _pin_torch(threads: int | None) -> None:
    import torch

    torch.backends.mkldnn.enabled = False  # type: ignore[assignment]
    torch.backends.nnpack.set_flags(False)
    _set_threads(threads)
    cap = torch.backends.cpu.get_cpu_capability()
    if cap != PORTABLE_ISA:
        if cap in ("DEFAULT", "NO AVX"):  # the CPU itself lacks AVX2
            raise NumericsError(
                f"runtime.numerics: portable needs an x86-64 CPU with AVX2; this one runs "
                f"ATen at {cap} ({cpu_model()}); use runtime.numerics=native"
            )
        raise NumericsError(
            f"runtime.numerics: portable, but torch already computed in this process with "
            f"ATen at {cap}; start it with ATEN_CPU_CAPABILITY=avx2 MKL_CBWR=COMPATIBLE set, or "
            f"call fedcore.numerics.apply('portable') before anything computes"
        )
    branch = mkl_branch()
    if branch is not None and branch != "COMPATIBLE":
        lib = _mkl()
        rc = lib.mkl_serv_cbwr_set(_MKL_COMPATIBLE) if lib is not None else -1
        if rc != 0 or mkl_branch() != "COMPATIBLE":
            raise NumericsError(
                f"runtime.numerics: portable, but MKL already computed in this process on "
                f"its {branch} branch; start it with MKL_CBWR=COMPATIBLE set, or call "
                f"fedcore.numerics.apply('portable') before anything computes"
            )


def _mkl() -> Any:
    """MKL inside libtorch_cpu (the x86-64 wheels link it statically), or None."""
    import torch

    path = Path(torch.__file__).parent / "lib" / "libtorch_cpu.so"
    try:
        lib = ctypes.CDLL(str(path))
        lib.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
        lib.mkl_serv_cbwr_set.argtypes = [ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return lib


def mkl_branch() -> str | None:
    """MKL's CNR branch in force (reading it initialises MKL's CNR from MKL_CBWR)."""
    lib = _mkl()
    if lib is None:
        return None
    code = int(lib.mkl_serv_cbwr_get(_MKL_CBWR_BRANCH))
    return _MKL_BRANCHES.get(code, str(code))


def mkl_version() -> str | None:
    lib = _mkl()
    if lib is None or not hasattr(lib, "MKL_Get_Version_String"):
        return None
    buf = ctypes.create_string_buffer(256)
    lib.MKL_Get_Version_String(buf, len(buf))
    return buf.value.decode(errors="replace").strip()


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def cpu_isa() -> str:
    """The CPU's own highest x86-64 vector level (what native numerics would use)."""
    flags: set[str] = set()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if not flags:
        return platform.machine()
    for level, needs in (
        ("AVX512-AMX", {"avx512f", "amx_tile"}),
        ("AVX512", {"avx512f", "avx512bw", "avx512vl"}),
        ("AVX2", {"avx2", "fma"}),
        ("AVX", {"avx"}),
    ):
        if needs <= flags:
            return level
    return "SSE"


def provenance() -> dict[str, Any]:
    """Where a run's numbers came from: the mode, the CPU and what computed on it."""
    import numpy
    import torch

    return {
        "numerics": mode_in_force(),
        "cpu": cpu_model(),
        "cpu_isa": cpu_isa(),
        "machine": platform.machine(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "mkl": mkl_version(),
        "mkl_cbwr": mkl_branch(),
        "onednn": _onednn_version(),
        "onednn_enabled": bool(torch.backends.mkldnn.enabled),
        "nnpack_enabled": bool(torch._C._get_nnpack_enabled()),
    }


def _onednn_version() -> str | None:
    import torch

    found = re.search(r"MKL-DNN v([0-9.]+)", torch.__config__.show())
    return found.group(1) if found else None
