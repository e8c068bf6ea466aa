from __future__ import annotations

import pytest

from rlkit.config.allocation import Allocation, ServerAllocation, TrainerAllocation, parse_allocation
from rlkit.errors import ConfigError


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("vllm:d2", Allocation(ServerAllocation("vllm", 2, 1), None)),
        ("sglang:d4t2+fsdp:d8", Allocation(ServerAllocation("sglang", 4, 2), TrainerAllocation("fsdp", 8))),
        ("vllm:t2d3+fsdp:d1", Allocation(ServerAllocation("vllm", 3, 2), TrainerAllocation("fsdp", 1))),
        (" vllm:d1 + fsdp:d2 ", Allocation(ServerAllocation("vllm", 1, 1), TrainerAllocation("fsdp", 2))),
    ],
)
def test_parses_valid_modes(mode: str, expected: Allocation) -> None:
    assert parse_allocation(mode) == expected


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("", "expected one server part"),
        ("vllm:d2+", "expected one server part"),
        ("vllm:d2+fsdp:d2+fsdp:d2", "expected one server part"),
        ("trt:d2", "unknown backend 'trt'"),
        ("vllm:d2d3", "'d' given twice"),
        ("vllm:p2", "vllm takes only d, t"),
        ("fsdp:d2t2", "fsdp takes only d"),
        ("vllm:d0", "must be at least 1"),
        ("vllm", "is not backend:dims"),
        ("fsdp:d4+vllm:d2", "put the server part first"),
        ("vllm:d2+sglang:d2", "more than one server part"),
    ],
)
def test_rejects_bad_modes_with_a_reason(mode: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_allocation(mode)
    assert says in info.value.message
    assert info.value.hint and "vllm:d2t2+fsdp:d4" in info.value.hint
