"""Fixtures of the trainer's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch.distributed as dist


@pytest.fixture(scope="module")
def gloo() -> Iterator[None]:
    """A process group of one gloo rank for the module's real steps (collectives of a world of one)."""
    from rlkit.servers.health import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
