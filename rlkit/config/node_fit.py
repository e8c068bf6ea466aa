"""How GPUs of a component sit on nodes (pure): a unit (one server's tensor-parallel GPUs, one trainer rank) never
straddles nodes, and a component that takes whole nodes of its own fills them.

Two questions, one rule: `unit_unplaceable` (can a unit sit on any node at all?) is asked by the planner's placement
(rlkit.launch.placement) and by validation before it (rlkit.checks.auxiliary), so the two cannot disagree; `misfit`
(does a component fill whole nodes of its own?) decides whether the heterogeneous job is possible, else the steps
share nodes (a packed job), so a unit that does not divide a node is still placed. Each caller words the answer for
its own reader. It lives in config because config must not import launch.
"""

from __future__ import annotations

from enum import Enum


class Misfit(Enum):
    """Why a layout does not fit whole nodes."""

    NO_GPU = "a size is below 1"
    UNIT_OVER_NODE = "one unit needs more GPUs than a node has"
    UNIT_SPLITS_NODE = "a node's GPUs do not divide into whole units"
    PARTIAL_NODES = "more GPUs than one node, but not whole nodes"


def unit_unplaceable(gpus_per_unit: int, gpus_per_node: int) -> Misfit | None:
    """Why a unit of `gpus_per_unit` GPUs fits no node, whatever the placement (None: it fits one node)."""
    if gpus_per_unit < 1:
        return Misfit.NO_GPU
    if gpus_per_unit > gpus_per_node:
        return Misfit.UNIT_OVER_NODE
    return None


def unit_misfit(gpus_per_unit: int, gpus_per_node: int) -> Misfit | None:
    """Why units of `gpus_per_unit` GPUs cannot fill nodes of `gpus_per_node` whole (None: they can)."""
    if why := unit_unplaceable(gpus_per_unit, gpus_per_node):
        return why
    if gpus_per_node % gpus_per_unit:
        return Misfit.UNIT_SPLITS_NODE
    return None


def misfit(gpus: int, gpus_per_unit: int, gpus_per_node: int) -> Misfit | None:
    """Why `gpus` GPUs in units of `gpus_per_unit` do not fit nodes of `gpus_per_node` (None: they do)."""
    if gpus < 1:
        return Misfit.NO_GPU
    why = unit_misfit(gpus_per_unit, gpus_per_node)
    if why is None and gpus > gpus_per_node and gpus % gpus_per_node:
        return Misfit.PARTIAL_NODES
    return why


def nodes_for(gpus: int, gpus_per_node: int) -> tuple[int, int]:
    """(nodes, GPUs used per node) of a layout that fits (misfit() is None): one node, or whole nodes."""
    if gpus <= gpus_per_node:
        return 1, gpus
    return gpus // gpus_per_node, gpus_per_node
