"""One rule fits servers on nodes (rlkit.config.node_fit): validation refuses an auxiliary model's server size exactly
when the planner cannot place it, each in its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.node_fit import Misfit, misfit, nodes_for, unit_unplaceable
from rlkit.errors import ConfigError
from rlkit.jobs.validate import validate
from tests.helpers.planning import plan_of


@pytest.mark.parametrize(("per_unit", "per_node", "expected"), [
    (1, 8, None), (3, 8, None), (8, 8, None), (0, 8, Misfit.NO_GPU), (9, 8, Misfit.UNIT_OVER_NODE),
    (1, 0, Misfit.UNIT_OVER_NODE),
])
def test_only_a_unit_below_one_gpu_or_over_a_node_fits_no_node(per_unit: int, per_node: int,
                                                                expected: Misfit | None) -> None:
    """Steps that share nodes take units that do not divide a node (3 of 8): only these sizes fit no placement."""
    assert unit_unplaceable(per_unit, per_node) is expected


@pytest.mark.parametrize(("gpus", "per_unit", "per_node", "expected"), [
    (8, 2, 8, None), (16, 4, 8, None), (3, 1, 4, None),
    (0, 1, 8, Misfit.NO_GPU), (2, 0, 8, Misfit.NO_GPU),
    (16, 16, 8, Misfit.UNIT_OVER_NODE), (1, 1, 0, Misfit.UNIT_OVER_NODE),
    (3, 3, 8, Misfit.UNIT_SPLITS_NODE),
    (12, 4, 8, Misfit.PARTIAL_NODES),
])
def test_misfit_names_the_first_rule_a_layout_breaks(gpus: int, per_unit: int, per_node: int,
                                                    expected: Misfit | None) -> None:
    assert misfit(gpus, per_unit, per_node) is expected
    if expected is None:
        nodes, used = nodes_for(gpus, per_node)
        assert nodes * used == gpus and used <= per_node


@pytest.mark.parametrize("per_node", [1, 4, 8])
@pytest.mark.parametrize("tp", [1, 2, 3, 8, 16])
def test_validation_refuses_a_server_size_exactly_when_the_plan_cannot_place_it(
        grpo_yaml: Path, fake_model: Path, tp: int, per_node: int) -> None:
    config = load_config(grpo_yaml, [f"auxiliary_models=[{{name: judge, model_path: {fake_model}, "
                                     f"tensor_parallel_size: {tp}}}]", f"cluster.n_gpus_per_node={per_node}",
                                     "cluster.n_nodes=4"])
    refused = any("does not fit one server on a node" in str(e) for e in validate(config).problems.errors)
    try:
        plan_of(config)
        placed = True
    except ConfigError as error:
        assert "auxiliary_models[0]" in error.message
        assert f"one auxiliary judge needs {tp} GPUs but a node has {per_node}" in error.message
        placed = False
    assert refused == (not placed)
    assert refused == (tp > per_node)  # a server that does not divide a node shares it with other steps
