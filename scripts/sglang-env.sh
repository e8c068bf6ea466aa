#!/usr/bin/env bash
# The venv the SGLang contract tests run a real SGLang server from (tests/integration/test_sglang_backend.py),
# created idempotently: sglang==0.5.23 (the version rlkit.servers.sglang.backend and the test-only CPU kernel shim in
# tests/sglang_cpu_shim were checked against) in its own venv, apart from the dev venv (it pins another torch), with
# exactly the versions of scripts/locks/sglang.txt (written by `bash scripts/lock.sh sglang`).
# ~11 GB, ~4-7 min cold; a second run only checks the installed versions (~0.3 s). Prints the venv's python path as
# its last line. RLKIT_SGLANG_VENV overrides the location. With --check it installs nothing: it prints the python
# path when the locked versions are there and exits 1 (with how to install them) when not.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want=0.5.23
lock=$repo/scripts/locks/sglang.txt
venv=${RLKIT_SGLANG_VENV:-$HOME/.cache/rlkit-sglang/venv}
py=$venv/bin/python
log=$(dirname "$venv")/install.log

locked() {  # the venv holds exactly the lock's versions
  [ -x "$py" ] && "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1
}

if [ "${1:-}" = "--check" ]; then
  if locked; then echo "$py"; exit 0; fi
  echo "sglang-env: $venv does not hold sglang==$want at the versions of scripts/locks/sglang.txt; install them with" \
    "scripts/sglang-env.sh (~11 GB, a few minutes)" >&2
  exit 1
fi
mkdir -p "$(dirname "$venv")"
if [ ! -x "$py" ]; then
  echo "sglang-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if ! locked; then
  echo "sglang-env: installing sglang==$want and the versions of scripts/locks/sglang.txt into $venv (several" \
    "minutes; log in $log)" >&2
  if ! "$py" -m pip install --no-deps -r "$lock" >>"$log" 2>&1; then
    echo "sglang-env: pip install -r scripts/locks/sglang.txt failed; see $log" >&2
    exit 1
  fi
  if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >&2; then
    echo "sglang-env: after the install, $venv does not match scripts/locks/sglang.txt; see $log" >&2
    exit 1
  fi
fi
echo "$py"
