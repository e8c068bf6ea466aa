"""Imported last by the tests' CLI zygote (tests/helpers/cli_zygote.py): a refused `rlkit submit` and a dry-run
preparation of a CPU demo config, run in the zygote before it forks. What a process's first call builds once (the
schema's OmegaConf tree and type hints, OmegaConf's interpolation grammar, rich's and typer's error rendering, the
modules the checks import lazily) is then inherited by every forked call instead of being built again in each:
6 refused submits and 6 renders forked from the zygote took 3.67 CPU-s without this, 2.01 with it (0.36 once, in
the zygote). Only what does not change is cached that way (the schema, the grammar, code); a refused submit and a
dry run write nothing and submit nothing."""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parents[2] / "configs" / "grpo-cpu-demo.yaml"


def _warm_up() -> None:
    import rlkit.cli.main
    from rlkit.config.load import load_config
    from rlkit.errors import ConfigError
    from rlkit.launch.submit import prepare_config

    argv = sys.argv
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        with contextlib.suppress(ConfigError):  # the demo's model and data need not exist here: checks still run
            prepare_config(load_config(DEMO), dry_run=True)
        sys.argv = ["rlkit", "submit", str(DEMO), "actor.optimizer.lr=not-a-number"]  # refused: exit 2
        try:
            rlkit.cli.main.main()
        except SystemExit:
            pass
        finally:
            sys.argv = argv


_warm_up()
