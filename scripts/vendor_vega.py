"""Rebuild vendor/vega/dvc-plots.html, the page template of `dvc plots show` (.dvc/config
`plots.html_template`): DVC's own page with vega, vega-lite and vega-embed inlined, so the
interactive charts render offline (dvc-render's page loads them from a CDN).

The versions are the ones dvc-render pins in its CDN URLs (dvc_render/vega.py), fetched with
`npm pack` from the npm registry; their licenses are copied beside the template. Run it after
upgrading dvc-render (needs `npm` and the registry):

    .venv/bin/python scripts/vendor_vega.py
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "vendor" / "vega"
PACKAGES = ("vega", "vega-lite", "vega-embed")  # load order: vega-embed needs the other two
PLACEHOLDERS = ("{scripts}", "{plot_divs}", "{refresh_tag}")

PAGE = """<!DOCTYPE html>
<html>
<head>
    {{refresh_tag}}
    <meta charset="utf-8">
    <title>DVC Plot</title>
    <!-- dvc-render's page (dvc_render/html.py) without its scripts placeholder: the CDN
         scripts it would insert are inlined below. Built by scripts/vendor_vega.py from
         {sources} (BSD-3-Clause, licenses in vendor/vega/). -->
{inlined}
    <style>
        table {{
            border-spacing: 15px;
        }}
    </style>
</head>
<body>
    {{plot_divs}}
</body>
</html>
"""


def pinned_versions() -> dict[str, str]:
    """package -> version, from dvc-render's CDN script URLs."""
    from dvc_render.vega import VegaRenderer

    found = dict(re.findall(r"cdn\.jsdelivr\.net/npm/([a-z-]+)@([0-9.]+)", VegaRenderer.SCRIPTS))
    missing = [p for p in PACKAGES if p not in found]
    if missing:
        sys.exit(f"vendor_vega: dvc-render no longer names {', '.join(missing)} in its scripts")
    return {p: found[p] for p in PACKAGES}


def main() -> None:
    versions = pinned_versions()
    scripts, sources = [], []
    with tempfile.TemporaryDirectory() as tmp:
        specs = [f"{p}@{v}" for p, v in versions.items()]
        subprocess.run(
            ["npm", "pack", "--silent", *specs], cwd=tmp, check=True, stdout=subprocess.DEVNULL
        )
        OUT.mkdir(parents=True, exist_ok=True)
        for package, version in versions.items():
            tgz = Path(tmp) / f"{package}-{version}.tgz"
            digest = hashlib.sha256(tgz.read_bytes()).hexdigest()
            with tarfile.open(tgz) as tar:
                js = _member(tar, f"package/build/{package}.min.js").decode()
                licence = _member(tar, "package/LICENSE")
            bad = [p for p in (*PLACEHOLDERS, "</script") if p in js]
            if bad:
                sys.exit(f"vendor_vega: {package}.min.js contains {bad}: cannot be inlined")
            (OUT / f"LICENSE-{package}").write_bytes(licence)
            scripts.append(f"    <script>/* {package}@{version} */\n{js}\n    </script>")
            sources.append(f"{package}@{version} (npm tarball sha256 {digest})")
    page = PAGE.format(sources=",\n         ".join(sources), inlined="\n".join(scripts))
    counts = [page.count(p) for p in PLACEHOLDERS]
    if counts != [0, 1, 1]:  # DVC fills these by plain replacement
        sys.exit(f"vendor_vega: placeholders {PLACEHOLDERS} occur {counts} times, not 0, 1, 1")
    tmp_page = OUT / "dvc-plots.html.tmp"
    tmp_page.write_text(page, encoding="utf8")
    tmp_page.replace(OUT / "dvc-plots.html")
    print(f"wrote {OUT / 'dvc-plots.html'} ({len(page.encode()) // 1024} KiB)")


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    f = tar.extractfile(name)
    if f is None:
        sys.exit(f"vendor_vega: {name} missing from the npm tarball")
    return f.read()


if __name__ == "__main__":
    main()
