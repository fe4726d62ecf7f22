#!/usr/bin/env bash
# Idempotent set-up used by `make run` / `make test`: virtual environment, the project and
# its pinned dependencies, and the embedded default data. A second call does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FEDAPT_VENV:-.venv}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
STAMP="$VENV/.fedapt-install-stamp"
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "fedapt: installing into $VENV (first time: a few minutes)" >&2
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install -q --upgrade "pip>=24" >/dev/null
    # constraints.txt pins every package to the versions verified together; no backtracking.
    "$VENV/bin/python" -m pip install -q -c constraints.txt -e ".[dev]"
    echo "$want" > "$STAMP"
fi

bash scripts/get-data.sh
