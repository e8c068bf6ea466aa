#!/usr/bin/env bash
# The venv the docs site is built from (`mkdocs build --strict`, the lint session), created idempotently: mkdocs-material
# (pyproject.toml's `docs` extra) in its own small venv, apart from the dev venv, with exactly the versions of
# scripts/locks/docs.txt (written by `bash scripts/lock.sh docs`). ~30 MB, seconds cold; a second run only checks the
# installed versions (~0.3 s). Prints the venv's python path as its last line. RLKIT_DOCS_VENV overrides the location.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
lock=$repo/scripts/locks/docs.txt
venv=${RLKIT_DOCS_VENV:-$HOME/.cache/rlkit-docs/venv}
py=$venv/bin/python
log=$(dirname "$venv")/install.log

locked() {  # the venv holds exactly the lock's versions
  [ -x "$py" ] && "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1
}

mkdir -p "$(dirname "$venv")"
if [ ! -x "$py" ]; then
  echo "docs-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if ! locked; then
  echo "docs-env: installing mkdocs-material and the versions of scripts/locks/docs.txt into $venv (log in $log)" >&2
  if ! "$py" -m pip install -q --no-deps -r "$lock" >>"$log" 2>&1; then
    echo "docs-env: pip install -r scripts/locks/docs.txt failed; see $log" >&2
    exit 1
  fi
  if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >&2; then
    echo "docs-env: after the install, $venv does not match scripts/locks/docs.txt; see $log" >&2
    exit 1
  fi
fi
echo "$py"
