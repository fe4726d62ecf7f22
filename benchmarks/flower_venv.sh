#!/usr/bin/env bash
# A venv for benchmarks/ray_clients.py's Flower runner: Flower is not a dependency of fedapt.
# It sees fedapt's venv (torch, numpy, fedcore's imports) through a .pth file placed after its
# own packages, so only Flower and what it pins (its own Ray among them) are installed here.
# Run from the repository root:  bash benchmarks/flower_venv.sh
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
venv="$here/benchmarks/.venv-flower"
python3.11 -m venv "$venv"
site="$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
main="$("$here/.venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$main" > "$site/zz_fedapt_venv.pth"
"$venv/bin/pip" install -q "flwr[simulation]==1.42.0"
"$venv/bin/python" -c 'import flwr, ray; print("flwr", flwr.__version__, "ray", ray.__version__)'
