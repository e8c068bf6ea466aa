"""The demo (`bash scripts/demo.sh` -> `python -m rlkit.cli.demo`) finds the checkout's config wherever its module
sits in the package (a move of the module one folder deeper once sent it to rlkit/configs/)."""

from __future__ import annotations

from rlkit.cli import demo
from tests.conftest import REPO


def test_the_demo_submits_the_checkouts_demo_config() -> None:
    assert demo.REPO == REPO
    assert demo.DEMO_CONFIG == REPO / "configs" / "grpo-cpu-demo.yaml"
    assert demo.DEMO_CONFIG.is_file()
