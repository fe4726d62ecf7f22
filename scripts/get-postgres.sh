#!/usr/bin/env bash
# PostgreSQL's server programs for `fedapt up --store postgres` and its test
# (tests/flows/services/test_postgres.py): Debian's postgresql package (initdb, postgres, pg_isready
# in /usr/lib/postgresql/<major>/bin, pg_trgm included). Root installs it; otherwise a hint
# (the default store, SQLite, needs none of it).
set -euo pipefail

compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "fedapt: installing Debian package postgresql (fedapt up --store postgres)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q postgresql >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q postgresql >/dev/null; } \
        || { echo "fedapt: could not install postgresql; run: sudo apt-get install -y postgresql" >&2; exit 1; }
else
    echo "fedapt: PostgreSQL is missing (fedapt up --store postgres and its test need it); run: sudo apt-get install -y postgresql" >&2
fi
