#!/usr/bin/env bash
# The venv OpenAI Agents SDK programs run from (rlkit never imports the SDK: a program runs as a command in this venv
# and talks to rlkit's agent endpoint over HTTP, as its users run it), created idempotently: openai-agents==0.24.0
# with exactly the versions of scripts/locks/agents.txt (written by `bash scripts/lock.sh agents`), apart from the
# dev venv (the SDK pins its own openai). The suite's Agents SDK tests run their programs with it
# (tests/unit/agent/test_agents_sdk.py reads RLKIT_AGENTS_PYTHON, which scripts/test.sh exports).
# ~120 MB, ~1 min cold; a second run only checks the installed versions (~0.1 s). Prints the venv's python path as its
# last line. RLKIT_AGENTS_VENV overrides the location. With --check it installs nothing: it prints the python path
# when the locked versions are there and exits 1 (with how to install them) when not.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
want=0.24.0
lock=$repo/scripts/locks/agents.txt
venv=${RLKIT_AGENTS_VENV:-$HOME/.cache/rlkit-agents/venv}
py=$venv/bin/python
home=$(dirname "$venv")
log=$home/install.log

locked() {  # the venv holds exactly the lock's versions
  [ -x "$py" ] && "$py" "$repo/scripts/lockcheck.py" "$lock" >/dev/null 2>&1
}

if [ "${1:-}" = "--check" ]; then
  if locked; then echo "$py"; exit 0; fi
  echo "agents-env: $venv does not hold openai-agents==$want at the versions of scripts/locks/agents.txt;" \
    "install them with scripts/agents-env.sh (~120 MB, about a minute)" >&2
  exit 1
fi
mkdir -p "$home"
if [ ! -x "$py" ]; then
  echo "agents-env: creating $venv" >&2
  python3 -m venv "$venv"
fi
if ! locked; then
  echo "agents-env: installing openai-agents==$want and the versions of scripts/locks/agents.txt into $venv" \
    "(log in $log)" >&2
  if ! "$py" -m pip install --no-deps -r "$lock" >>"$log" 2>&1; then
    echo "agents-env: pip install -r scripts/locks/agents.txt failed; see $log" >&2
    exit 1
  fi
  if ! "$py" "$repo/scripts/lockcheck.py" "$lock" >&2; then
    echo "agents-env: after the install, $venv does not match scripts/locks/agents.txt; see $log" >&2
    exit 1
  fi
fi
echo "$py"
