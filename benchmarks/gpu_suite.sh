#!/usr/bin/env bash
# fedapt's GPU checks in one script, about 10 minutes on one H100 or H200:
#   1. tests/fedcore/engine/test_gpu.py        CUDA against CPU, bytes, run-to-run bits
#   2. benchmarks/gpu_kernels.py --rounds 40   the cohort step's kernel choices and CUDA graphs
#   3. benchmarks/pfl_e2e.py                   the pfl-research shape end to end, twice, bits
#   4. benchmarks/cohort_gpu_profile.py w1     the W1 round, cohort and sequential engines
#   5. benchmarks/cohort_cpu.py --only resnet  a seed-000 ResNet26 cell, both engines
#                                              (needs data/raw/FashionMNIST; skipped, and said
#                                              so, without it)
# Results go to $OUT when set (a lent machine's return folder), else to
# benchmarks/results/gpu_<device>_<date>/, with each step's log and its exit status in
# suite.json. A step that fails is recorded and the next one runs.
#
#   bash benchmarks/gpu_suite.sh            # the whole suite
#   QUICK=1 bash benchmarks/gpu_suite.sh    # every step cut short (a 2-3 minute smoke run)
#
# The lent machine's Python has torch but not pydantic: install the wheels that
# benchmarks/pfl_e2e.py names into a folder on PYTHONPATH first, and for steps 4-5
# efficientnet-lite-pytorch 0.1.0 too (`import models` imports every backbone's module
# today; seen failing without it on an H100, 2026-11-28).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
device=$("$PY" -c "import torch; print(torch.cuda.get_device_name().split()[1].lower() if torch.cuda.is_available() else 'none')" 2>/dev/null)
if [ -z "$device" ] || [ "$device" = none ]; then
    echo "gpu_suite: no CUDA device for $PY (no torch, or torch.cuda.is_available() is False; PYTHON=... names another)" >&2
    exit 2
fi
D=${OUT:-benchmarks/results/gpu_${device}_$(date -u +%Y-%m-%d)}
mkdir -p "$D"
quick=${QUICK:-0}
status=()

step() { # name, command...: run it, keep its log, record its exit status and seconds
    local name=$1
    shift
    local t0=$SECONDS
    echo "### $name: $*"
    "$@" >"$D/$name.log" 2>&1
    local rc=$?
    status+=("\"$name\": {\"rc\": $rc, \"seconds\": $((SECONDS - t0))}")
    tail -3 "$D/$name.log"
}

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    "$PY" -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.backends.cudnn.version())"
    git log -1 --format=%H 2>/dev/null || echo "no git"
} >"$D/env.txt" 2>&1

step test_gpu "$PY" -m pytest -q -p no:cacheprovider -m "slow or not slow" tests/fedcore/engine/test_gpu.py
if [ "$quick" = 1 ]; then
    step kernels "$PY" benchmarks/gpu_kernels.py --device cuda --steps 10 --rounds 5 --out "$D"
    step pfl_e2e "$PY" benchmarks/pfl_e2e.py --device cuda --rounds 50 --budget-s 60 --out "$D"
    step w1 "$PY" benchmarks/cohort_gpu_profile.py --workloads w1 --w1-rounds 2 --out "$D"
else
    step kernels "$PY" benchmarks/gpu_kernels.py --device cuda --profile --rounds 40 --out "$D"
    step pfl_e2e "$PY" benchmarks/pfl_e2e.py --device cuda --budget-s 260 --out "$D"
    step w1 "$PY" benchmarks/cohort_gpu_profile.py --workloads w1 --out "$D"
fi
# cohort_gpu_profile.py records a failed child in its JSON and still exits 0
if grep -qs '"error"' "$D/cohort_gpu_profile.json"; then
    status+=("\"w1_children\": {\"rc\": 1, \"why\": \"a child failed: w1.log, cohort_gpu_profile.json\"}")
fi
if [ -f data/raw/FashionMNIST/raw/train-images-idx3-ubyte ]; then
    rounds=$([ "$quick" = 1 ] && echo 2 || echo 0)
    step resnet "$PY" benchmarks/cohort_cpu.py --device cuda --only resnet --rounds "$rounds"
    cp benchmarks/results/cohort_gpu.json "$D/resnet_cell.json" 2>/dev/null
else
    echo "### resnet: skipped (no data/raw/FashionMNIST here)"
    status+=("\"resnet\": {\"rc\": null, \"skipped\": \"no data/raw/FashionMNIST\"}")
fi
(IFS=,; echo "{${status[*]}}") >"$D/suite.json"
echo "gpu_suite: results in $D"
grep -q '"rc": [1-9]' "$D/suite.json" && exit 1 || exit 0
