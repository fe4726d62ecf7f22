#!/usr/bin/env bash
# The browser of the UI tests (tests/flows/services/test_browser.py): Debian's chromium, driven by Playwright
# (a dev dependency) through executable_path=/usr/bin/chromium; Playwright never downloads a
# browser. Root installs it; otherwise a hint (`make run` needs no browser, `make test` does).
set -euo pipefail

command -v chromium >/dev/null && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fedapt: installing Debian package chromium (the UI tests' browser)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q chromium >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium >/dev/null; } \
        || { echo "fedapt: could not install chromium; run: sudo apt-get install -y chromium" >&2; exit 1; }
else
    echo "fedapt: chromium is missing (the UI tests need it); run: sudo apt-get install -y chromium" >&2
fi
