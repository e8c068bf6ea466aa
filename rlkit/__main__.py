"""`python -m rlkit` runs the CLI (how in-job steps start, with the job's own interpreter)."""

from rlkit.cli.main import main

main()
