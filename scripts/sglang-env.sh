#!/usr/bin/env bash
# The venv the SGLang contract tests run a real SGLang server from (tests/integration/test_sglang_backend.py),
# created idempotently: sglang==0.5.23 (the version rlkit.servers.sglang.backend and the test-only CPU kernel shim in
# tests/sglang_cpu_shim were checked against) in its own venv, apart from the dev venv (it pins another torch).
# ~11 GB, ~4-7 min cold; a second run only checks the installed version. Prints the venv's python path as its last
# line. RLKIT_SGLANG_VENV overrides the location. With --check it installs nothing: it prints the python path when
# the pinned version is there and exits 1 (with how to install it) when not.
set -euo pipefail
want=0.5.23
venv=${RLKIT_SGLANG_VENV:-$HOME/.cache/rlkit-sglang/venv}
py=$venv/bin/python
log=$(dirname "$venv")/install.log

installed() {
  "$py" -c "import importlib.metadata as m; print(m.version('sglang'))" 2>/dev/null || true
}

if [ "${1:-}" = "--check" ]; then
  if [ "$(installed)" = "$want" ]; then echo "$py"; exit 0; fi
  echo "sglang-env: sglang==$want is not installed in $venv; install it with scripts/sglang-env.sh (~11 GB, a few minutes)" >&2
  exit 1
fi
mkdir -p "$(dirname "$venv")"
if [ ! -x "$py" ]; then
  echo "sglang-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if [ "$(installed)" != "$want" ]; then
  echo "sglang-env: installing sglang==$want into $venv (several minutes; log in $log)" >&2
  if ! "$py" -m pip install "sglang==$want" >>"$log" 2>&1; then
    echo "sglang-env: pip install sglang==$want failed; see $log" >&2
    exit 1
  fi
  if [ "$(installed)" != "$want" ]; then
    echo "sglang-env: after the install, $py reports sglang $(installed), not $want; see $log" >&2
    exit 1
  fi
fi
echo "$py"
