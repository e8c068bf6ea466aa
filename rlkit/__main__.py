"""`python -m rlkit` runs the CLI (how in-job steps start, with the job's own interpreter)."""

import sys

import rlkit

# Python puts the current directory first on sys.path: there, a folder named rlkit without __init__.py (a default
# fileroot /tmp/rlkit, a checkout ~/rlkit seen from ~) is imported as a namespace package in place of an editable
# install, and the CLI died in an ImportError traceback
if getattr(rlkit, "__file__", None) is None:
    folders = ", ".join(getattr(rlkit, "__path__", []))
    sys.stderr.write(f"error: `python -m rlkit` found the folder {folders} in the current directory instead of the "
                     "rlkit package (Python looks in the current directory first)\n  fix: run the `rlkit` command, "
                     "or run `python -m rlkit` from another directory\n")
    sys.exit(2)

from rlkit.cli.main import main  # after the check: it imports rlkit's modules

main()
