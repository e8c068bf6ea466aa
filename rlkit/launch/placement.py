"""Placement (pure): on which nodes each step of the job runs, and with how many of a node's GPUs.

One rule decides between two shapes of job:
  * heterogeneous: each component (the policy's servers, each auxiliary model's, the trainer or client) takes whole
    nodes of its own, one `#SBATCH hetjob` block each. Kept whenever every component sits on nodes by the node-fit
    rule (rlkit.config.node_fit), the job fits cluster.n_nodes, and packing would use no fewer GPU nodes.
  * packed: one allocation of N nodes, every step on the nodes the plan gives it with its own slice of their GPUs
    (`srun --relative --exact --gres=gpu:k`). Slurm cannot place two components of one heterogeneous job on the
    same node, but the steps of one job share a node and split its GPUs (measured on the dev cluster, issue 28).
    Chosen when components must share nodes: everything fits on fewer nodes than whole-node components would take
    (AReaL's one-node examples), or GPU counts do not align with nodes (12 server + 4 trainer GPUs on nodes of 8).
Packing is first fit: the trainer first (its ranks together, on one node or whole nodes from node 0, so rank 0 is
the job's first node), then each server on the first node with room, the biggest first; a GPU-less client joins
node 0. Colocation (servers and trainer on the same GPUs) would be a third kind, not written yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlkit.config.node_fit import Misfit, misfit, nodes_for, unit_unplaceable
from rlkit.errors import ConfigError, ConfigErrors

HETEROGENEOUS = "heterogeneous"
PACKED = "packed"


@dataclass(frozen=True)
class Demand:
    """What one component needs: `units` units of `unit_gpus` GPUs. A block's units stay together (the trainer's
    ranks: one node, or whole nodes); other units (servers) are placed one by one. `label` names it in messages
    ("server", "auxiliary judge", "trainer"), `where` the field that sized it."""

    label: str
    units: int
    unit_gpus: int
    block: bool
    where: str

    @property
    def gpus(self) -> int:
        return self.units * self.unit_gpus


@dataclass(frozen=True)
class Slot:
    """Where one unit (or a block) runs: `nodes` nodes from `first_node` (counted within its het component, or
    within the job when packed), `gpus_per_node` GPUs on each."""

    first_node: int
    nodes: int
    gpus_per_node: int


@dataclass(frozen=True)
class Placement:
    """The rule's answer: the kind of job, why, and per demand (in order) one Slot per unit, or one for a block.
    `component_nodes`: each component's node count (heterogeneous), `nodes`: the nodes of the whole job."""

    kind: str
    why: str
    slots: tuple[tuple[Slot, ...], ...]
    component_nodes: tuple[int, ...]
    nodes: int

    @property
    def packed(self) -> bool:
        return self.kind == PACKED


PLACE_AT_MOST = 65_536  # GPUs: a layout over this that cannot fit cluster.n_nodes is refused without being placed


def _unit_problem(demand: Demand, gpn: int) -> ConfigError | None:
    """A unit that fits no node, or a block over one node that cannot fill whole nodes: no placement helps."""
    if unit_unplaceable(demand.unit_gpus, gpn) is Misfit.NO_GPU or demand.units < 1:  # validation names it too
        return ConfigError(
            f"{demand.where}: one {demand.label} needs at least one GPU (got {demand.unit_gpus} per {demand.label}, "
            f"{demand.gpus} in all)",
            hint="use sizes of at least 1",
        )
    if unit_unplaceable(demand.unit_gpus, gpn) is Misfit.UNIT_OVER_NODE:
        return ConfigError(
            f"{demand.where}: one {demand.label} needs {demand.unit_gpus} GPUs but a node has {gpn}",
            hint="lower the tensor-parallel size, or set cluster.n_gpus_per_node to what your nodes have",
        )
    if demand.block and demand.gpus > gpn and demand.gpus % gpn:
        return ConfigError(
            f"{demand.where}: the {demand.label}'s {demand.gpus} GPUs span more than one node, so they must fill "
            f"whole nodes of {gpn} GPUs",
            hint=f"use a multiple of {gpn} GPUs (e.g. {(demand.gpus // gpn + 1) * gpn}) or fewer than {gpn + 1}",
        )
    return None


def _heterogeneous(demands: list[Demand], gpn: int) -> Placement | None:
    """Each component on whole nodes of its own (today's job), or None when some component does not sit on nodes
    by the node-fit rule (its GPUs more than a node but not whole nodes, or units that do not divide a node)."""
    slots: list[tuple[Slot, ...]] = []
    nodes: list[int] = []
    for demand in demands:
        if demand.unit_gpus == 0:  # a GPU-less client: a node of its own
            slots.append((Slot(0, 1, 0),))
            nodes.append(1)
            continue
        if misfit(demand.gpus, demand.unit_gpus, gpn) is not None:
            return None
        count, per_node = nodes_for(demand.gpus, gpn)
        nodes.append(count)
        if demand.block:
            slots.append((Slot(0, count, per_node),))
        else:
            per = per_node // demand.unit_gpus
            slots.append(tuple(Slot(i // per, 1, demand.unit_gpus) for i in range(demand.units)))
    return Placement(
        HETEROGENEOUS, "every component takes whole nodes of its own", tuple(slots), tuple(nodes), sum(nodes)
    )


def _packed(demands: list[Demand], gpn: int) -> Placement:
    """First fit: blocks first, from node 0 (a block over one node takes whole nodes), then units, biggest first."""
    free: list[int] = []
    slots: dict[tuple[int, int], Slot] = {}
    full = 0  # free[:full] are nodes with no GPU left: skipped, so that thousands of units place in linear time

    def first_fit(gpus: int) -> int:
        nonlocal full
        while full < len(free) and free[full] == 0:
            full += 1
        for node in range(full, len(free)):
            if free[node] >= gpus:
                free[node] -= gpus
                return node
        free.append(gpn - gpus)
        return len(free) - 1

    for d, demand in enumerate(demands):
        if demand.block and demand.gpus > gpn:
            start = len(free)
            free.extend([0] * (demand.gpus // gpn))
            slots[d, 0] = Slot(start, demand.gpus // gpn, gpn)
        elif demand.block and demand.unit_gpus:
            slots[d, 0] = Slot(first_fit(demand.gpus), 1, demand.gpus)
    units = [
        (demand.unit_gpus, d, u) for d, demand in enumerate(demands) if not demand.block for u in range(demand.units)
    ]
    for gpus, d, u in sorted(units, key=lambda unit: -unit[0]):  # stable: groups and servers keep their order
        slots[d, u] = Slot(first_fit(gpus), 1, gpus) if gpus else Slot(0, 1, 0)
    for d, demand in enumerate(demands):
        if demand.block and not demand.unit_gpus:
            slots[d, 0] = Slot(0, 1, 0)  # a GPU-less client joins the first node
    ordered = tuple(
        tuple(slots[d, u] for u in range(1 if demand.block else demand.units)) for d, demand in enumerate(demands)
    )
    nodes = max(1, len(free))
    return Placement(PACKED, "", ordered, (nodes,), nodes)


def _gpu_nodes(placement: Placement, demands: list[Demand]) -> int:
    """Nodes that hold GPUs of the job (a heterogeneous client's node holds none)."""
    if placement.packed:
        return placement.nodes
    return sum(n for n, demand in zip(placement.component_nodes, demands, strict=True) if demand.unit_gpus)


def _refusal(demands: list[Demand], packed: Placement, n_nodes: int, gpn: int, what: str) -> ConfigError:
    parts = " + ".join(f"{d.gpus} {d.label}" for d in demands if d.gpus)
    use = [gpn] * packed.nodes
    for slots in packed.slots:
        for slot in slots:
            for node in range(slot.first_node, slot.first_node + slot.nodes):
                use[node] -= slot.gpus_per_node
    per_node = ", ".join(f"{gpn - left}" for left in use[:16]) + (f", ... ({len(use)} nodes)" if len(use) > 16 else "")
    return ConfigError(
        f"{what} needs {packed.nodes} nodes of {cluster_gpus(gpn)} ({parts} GPUs, placed {per_node} per node) "
        f"but cluster.n_nodes is {n_nodes}",
        hint=f"set cluster.n_nodes={packed.nodes} or use fewer GPUs",
    )


def cluster_gpus(gpn: int) -> str:
    return f"{gpn} GPU" + ("" if gpn == 1 else "s")


def choose_placement(demands: list[Demand], n_nodes: int, gpn: int, *, what: str) -> Placement:
    """The one rule (module docstring): heterogeneous when it fits and packing saves no GPU node, else packed when
    it fits cluster.n_nodes, else a ConfigError naming the GPUs needed per node. `what` names the layout in
    messages (allocation_mode '...')."""
    problems = [p for p in (_unit_problem(d, gpn) for d in demands if d.unit_gpus or not d.block) if p is not None]
    if problems:
        raise problems[0] if len(problems) == 1 else ConfigErrors(problems)
    needed = sum(d.gpus for d in demands)
    if needed > max(n_nodes * gpn, PLACE_AT_MOST):  # said before placing: a d999999999 would not place in memory
        raise ConfigError(
            f"{what} needs {needed:,} GPUs but the cluster has {n_nodes} nodes of {cluster_gpus(gpn)} "
            f"({n_nodes * gpn:,} GPUs)",
            hint=f"set cluster.n_nodes={-(-needed // gpn)} or use fewer GPUs",
        )
    packed = _packed(demands, gpn)
    whole = _heterogeneous(demands, gpn)
    if whole is not None and whole.nodes <= n_nodes and _gpu_nodes(packed, demands) >= _gpu_nodes(whole, demands):
        return whole
    if packed.nodes > n_nodes:
        raise _refusal(demands, packed, n_nodes, gpn, what)
    if whole is None:
        why = "the components' GPUs do not sit on whole nodes of their own, so steps share nodes"
    elif whole.nodes > n_nodes:
        why = (
            f"whole nodes per component would take {whole.nodes} nodes, cluster.n_nodes is {n_nodes}, so steps "
            "share nodes"
        )
    else:
        why = (
            f"sharing nodes takes {packed.nodes} GPU node(s) instead of {_gpu_nodes(whole, demands)} with whole "
            "nodes per component"
        )
    return Placement(PACKED, why, packed.slots, packed.component_nodes, packed.nodes)
