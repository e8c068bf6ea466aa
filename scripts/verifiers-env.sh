#!/usr/bin/env bash
# The venv verifiers environments run from (rlkit never imports verifiers: the environment runs as a program in this
# venv and talks to rlkit over HTTP), created idempotently: verifiers==0.4.0 with exactly the versions of
# scripts/locks/verifiers.txt (written by `bash scripts/lock.sh verifiers`), apart from the dev venv (verifiers needs
# openai<3, the dev venv holds openai 3). Also a wheelhouse beside the venv with the packages of verifiers' chat
# program (its harnesses run a PEP 723 script through `uv sync --script`, which otherwise fetches them from PyPI on
# every new machine): pointing uv at it (UV_FIND_LINKS, an empty UV_DEFAULT_INDEX) runs a harness with no network.
# ~600 MB, ~3-4 min cold; a second run only checks the installed versions (~0.3 s). Prints the venv's python path as
# its last line. RLKIT_VERIFIERS_VENV overrides the location. With --check it installs nothing: it prints the python
# path when the locked versions and the wheelhouse are there and exits 1 (with how to install them) when not.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want=0.4.0
lock=$repo/scripts/locks/verifiers.txt
venv=${RLKIT_VERIFIERS_VENV:-$HOME/.cache/rlkit-verifiers/venv}
py=$venv/bin/python
home=$(dirname "$venv")
wheels=$home/wheelhouse
log=$home/install.log
# What verifiers 0.4.0's chat program (verifiers/v1/harnesses/utils/launch.py) declares in its script header.
program_deps=(openai "mcp==2.0.0" httpx httpx2 tenacity certifi)

locked() {  # the venv holds exactly the lock's versions, and the wheelhouse is complete
  [ -x "$py" ] && "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1 && [ -f "$wheels/.complete" ]
}

if [ "${1:-}" = "--check" ]; then
  if locked; then echo "$py"; exit 0; fi
  echo "verifiers-env: $venv does not hold verifiers==$want at the versions of scripts/locks/verifiers.txt (or its" \
    "wheelhouse); install them with scripts/verifiers-env.sh (~600 MB, a few minutes)" >&2
  exit 1
fi
mkdir -p "$home"
if [ ! -x "$py" ]; then
  echo "verifiers-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1; then
  echo "verifiers-env: installing verifiers==$want and the versions of scripts/locks/verifiers.txt into $venv" \
    "(a few minutes; log in $log)" >&2
  if ! "$py" -m pip install --no-deps -r "$lock" >>"$log" 2>&1; then
    echo "verifiers-env: pip install -r scripts/locks/verifiers.txt failed; see $log" >&2
    exit 1
  fi
  if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >&2; then
    echo "verifiers-env: after the install, $venv does not match scripts/locks/verifiers.txt; see $log" >&2
    exit 1
  fi
fi
if [ ! -f "$wheels/.complete" ]; then
  echo "verifiers-env: downloading the chat program's packages into $wheels (log in $log)" >&2
  if ! "$py" -m pip download -d "$wheels" -c "$lock" "${program_deps[@]}" >>"$log" 2>&1; then
    echo "verifiers-env: pip download of ${program_deps[*]} failed; see $log" >&2
    exit 1
  fi
  mkdir -p "$wheels/empty-index"  # uv's default index for offline runs (rlkit.agent.verifiers_workflow.offline_uv)
  touch "$wheels/.complete"
fi
echo "$py"
