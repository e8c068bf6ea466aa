from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.allocation import (
    Allocation,
    ServerAllocation,
    TrainerAllocation,
    canonical_mode,
    parse_allocation,
)
from rlkit.errors import ConfigError


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("vllm:d2", Allocation(ServerAllocation("vllm", 2, 1), None)),
        ("sglang:d4t2+fsdp:d8", Allocation(ServerAllocation("sglang", 4, 2), TrainerAllocation("fsdp", 8))),
        ("vllm:t2d3+fsdp:d1", Allocation(ServerAllocation("vllm", 3, 2), TrainerAllocation("fsdp", 1))),
        (" vllm:d1 + fsdp:d2 ", Allocation(ServerAllocation("vllm", 1, 1), TrainerAllocation("fsdp", 2))),
        # AReaL's earlier forms: '.' after the backend (2025), a trainer part without a backend, p/e/c at 1
        ("sglang.d4p1t1+d4p1t1", Allocation(ServerAllocation("sglang", 4, 1), TrainerAllocation("fsdp", 4))),
        ("sglang:d4p1t1+d4p1t1", Allocation(ServerAllocation("sglang", 4, 1), TrainerAllocation("fsdp", 4))),
        ("vllm:d2t2p1e1c1+fsdp:d8p1", Allocation(ServerAllocation("vllm", 2, 2), TrainerAllocation("fsdp", 8))),
        ("d2", Allocation(None, TrainerAllocation("fsdp", 2))),
    ],
)
def test_parses_valid_modes(mode: str, expected: Allocation) -> None:
    assert parse_allocation(mode) == expected
    assert parse_allocation(canonical_mode(expected)) == expected, "the canonical form reads back the same"


def test_canonical_form() -> None:
    assert canonical_mode(parse_allocation("sglang.d4p1t2+d8p1t1")) == "sglang:d4t2+fsdp:d8"
    assert canonical_mode(parse_allocation("d2")) == "fsdp:d2"


@pytest.mark.parametrize(
    ("mode", "says"),
    [
        ("", "expected one server part"),
        ("vllm:d2+", "expected one server part"),
        ("vllm:d2+fsdp:d2+fsdp:d2", "expected one server part"),
        ("trt:d2", "unknown backend 'trt'"),
        ("vllm:d2d3", "'d' given twice"),
        ("vllm:x2", "vllm takes only d, t (got 'x')"),
        ("vllm:p2", "'p2' in 'vllm:p2': pipeline parallelism (p) is not supported"),
        ("sglang:d2e4", "expert parallelism (e) is not supported"),
        ("d4c2", "context parallelism (c) is not supported"),
        ("fsdp:d2t2", "the FSDP trainer shards over its d ranks only"),
        ("sglang:d4+megatron:d4t2p2", "trainer backend 'megatron' is not supported: rlkit trains with FSDP2"),
        ("d4+vllm:d2", "put the server part first"),
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


def test_a_trial_records_the_canonical_form(grpo_yaml: Path) -> None:
    """AReaL's 2025 form goes in; the plan, and the config.yaml the job reads, carry rlkit's one form."""
    from rlkit.config.load import to_yaml
    from rlkit.launch.submit import prepare

    prepared = prepare(grpo_yaml, ["allocation_mode=vllm.d1p1t1+d2p1t1"], dry_run=True)
    assert prepared.config.allocation_mode == "vllm:d1+fsdp:d2"
    assert "allocation_mode: vllm:d1+fsdp:d2\n" in to_yaml(prepared.config)
    assert [c.role for c in prepared.plan.components] == ["server", "trainer"]
    assert prepared.plan.components[1].ntasks_per_node * prepared.plan.components[1].nodes == 2
