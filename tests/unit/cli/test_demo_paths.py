"""The demos (`bash scripts/demo.sh [NAME]` -> `python -m rlkit.cli.demo`) find the checkout's configs wherever the
module sits in the package (a move of the module one folder deeper once sent it to rlkit/configs/)."""

from __future__ import annotations

from rlkit.cli import demo
from rlkit.cli.demos import DEMOS
from tests.conftest import REPO


def test_every_demo_submits_a_config_of_the_checkout() -> None:
    assert demo.REPO == REPO
    assert DEMOS["grpo"].config == "grpo-cpu-demo.yaml"  # the README's demo
    for entry in DEMOS.values():
        assert (demo.REPO / "configs" / entry.config).is_file(), entry.name
