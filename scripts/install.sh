#!/usr/bin/env bash
# rlkit for a login node: a venv of its own holding rlkit and only what the login side needs (no torch, vLLM or
# trainer packages: those run in the job, from the images), at exactly the versions the test suite ran with (the
# dev lock, scripts/locks/dev.txt, as pip constraints), so every user of a site installs one program. Idempotent: a
# second run with nothing changed only checks (well under a second); after `git pull` it installs the new code.
#   bash scripts/install.sh [VENV]     # default ~/.local/share/rlkit/venv (or $RLKIT_INSTALL_VENV)
# The interpreter: $PYTHON, else python3; rlkit needs Python 3.11 or newer (`module load python/3.11` on many
# sites). Any user, no root. Prints the rlkit command's path as its last line.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-${RLKIT_INSTALL_VENV:-$HOME/.local/share/rlkit/venv}}
python=${PYTHON:-python3}
lock=$repo/scripts/locks/dev.txt

fail() {
  echo "install: $*" >&2
  exit 1
}

command -v "$python" >/dev/null 2>&1 || fail "no '$python' on PATH: set PYTHON to a Python 3.11 or newer"
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null) \
  || fail "'$python' does not run: set PYTHON to a Python 3.11 or newer"
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
  fail "rlkit needs Python 3.11 or newer; '$python' is $version (load a newer one, e.g. \`module load" \
    "python/3.11\`, or set PYTHON=/path/to/python3.11)"
fi
case "$venv" in /*) ;; *) venv=$PWD/$venv ;; esac
py=$venv/bin/python
log=$venv.install.log
# what the venv must hold: this checkout's code (rlkit.source_id, stdlib only: the id step 0 holds nodes to) and the
# versions (a changed module or lock installs again)
code=$(cd "$repo" && "$python" -c 'from rlkit.source_id import source_id; print(source_id())') \
  || fail "could not read $repo/rlkit (is this an rlkit checkout?)"
want="$code-$(cat "$repo/pyproject.toml" "$lock" | sha256sum | cut -c1-16)"
stamp=$venv/.rlkit-install
held() {  # the Python version of the venv's interpreter
  "$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null
}
if [ -x "$py" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want $(held)" ] && [ -x "$venv/bin/rlkit" ]; then
  echo "$venv/bin/rlkit"
  exit 0
fi
mkdir -p "$(dirname "$venv")"
if [ ! -x "$py" ]; then
  echo "install: creating $venv ($python, Python $version)" >&2
  "$python" -m venv "$venv" 2>"$log" || fail "could not create a venv at $venv (Debian: apt install" \
    "python3-venv); see $log"
elif [ "$(held)" != "$version" ]; then
  echo "install: $venv holds Python $(held), not $python's $version: installing into it (remove $venv to make" \
    "one with $python)" >&2
fi
echo "install: installing rlkit from $repo into $venv at the versions of scripts/locks/dev.txt (log in $log)" >&2
# Built from a copy of the package's files: setuptools writes its build/ and egg-info into the tree it builds, which
# fails in a checkout the user may not write (a site's shared clone), and a build/ left from before would put modules
# since deleted into the wheel. Not editable: the venv keeps the code it was installed with while the checkout moves
# on; run this again to update.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
(cd "$repo" && tar -cf - --exclude=__pycache__ pyproject.toml README.md rlkit) | tar -xf - -C "$src"
if ! "$py" -m pip install --upgrade --constraint "$lock" "$src" >>"$log" 2>&1; then
  fail "pip could not install rlkit; its errors (the whole output is in $log):
$(grep -i -E "error|denied|requires" "$log" | sort -u | tail -n 8)"
fi
if ! "$venv/bin/rlkit" --help >/dev/null 2>>"$log"; then
  fail "the installed rlkit does not start; see $log"
fi
echo "$want $(held)" >"$stamp"
echo "install: done; put it on your PATH: export PATH=\"$venv/bin:\$PATH\" (or link $venv/bin/rlkit into a" \
  "directory on it)" >&2
echo "$venv/bin/rlkit"
