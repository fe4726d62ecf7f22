#!/usr/bin/env bash
# Places the embedded default dataset (FashionMNIST, 60k/10k, from the Debian package
# dataset-fashion-mnist) under data/raw/FashionMNIST/raw in torchvision's on-disk layout.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=data/raw/FashionMNIST/raw
SRC=/usr/share/datasets/fashion-mnist
FILES="train-images-idx3-ubyte train-labels-idx1-ubyte t10k-images-idx3-ubyte t10k-labels-idx1-ubyte"

# DVC tracks data/ (data.dvc): its content goes into the project's DVC cache once, so that
# `dvc exp run --temp` (a fresh copy of the repository) can check it out.
cache_data() {
    local md5 dvc=${VENV:-.venv}/bin/dvc
    md5=$(sed -n 's/^- md5: \([0-9a-f]*\)\.dir$/\1/p' data.dvc)
    [ -n "$md5" ] && [ -x "$dvc" ] || return 0
    [ -f ".dvc/cache/files/md5/${md5:0:2}/${md5:2}.dir" ] && return 0
    DVC_NO_ANALYTICS=1 "$dvc" commit --force --quiet data.dvc \
        || echo "fedapt: could not put data/ into the DVC cache (dvc exp run --temp needs it)" >&2
}

have_all=1
for f in $FILES; do [ -s "$DEST/$f" ] || have_all=0; done
if [ "$have_all" = 1 ]; then cache_data; exit 0; fi

if [ ! -s "$SRC/train-images-idx3-ubyte.gz" ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
        echo "fedapt: installing Debian package dataset-fashion-mnist" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get install -y -q dataset-fashion-mnist >/dev/null 2>&1 \
            || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q dataset-fashion-mnist >/dev/null; } \
            || { echo "fedapt: could not install dataset-fashion-mnist; run: sudo apt-get install -y dataset-fashion-mnist" >&2; exit 1; }
    else
        echo "fedapt: FashionMNIST is missing; run: sudo apt-get install -y dataset-fashion-mnist" >&2
        exit 1
    fi
fi

tmp=$(mktemp -d "data/.raw-tmp.XXXXXX" 2>/dev/null || { mkdir -p data && mktemp -d "data/.raw-tmp.XXXXXX"; })
trap 'rm -rf "$tmp"' EXIT
for f in $FILES; do gunzip -c "$SRC/$f.gz" > "$tmp/$f"; done
mkdir -p "$DEST"
for f in $FILES; do mv -f "$tmp/$f" "$DEST/$f"; done
echo "fedapt: FashionMNIST placed in $DEST" >&2
cache_data
