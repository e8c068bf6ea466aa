"""Preflight against the cluster itself, before sbatch: does the partition exist, and do its nodes have the GPUs,
CPUs, memory and count each node request of the plan asks for (each component of a heterogeneous job, the one
request of a packed job), within the partition's time limit?

Slurm answers all of these with one terse line ("Requested node configuration is not available"), one problem at a
time, and a heterogeneous job only for its first component; and a layout that fits no usable node but some drained
one is accepted and then waits forever. Here every mismatch is named at once with the value the site has and what
to change. The reads (`scontrol show partition/node --oneliner`) are Slurm side effects; the checks are pure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rlkit.config.problems import Problems
from rlkit.launch import slurm
from rlkit.launch.plan import AUXILIARY_ROLE, CLIENT_ROLE, SERVER_ROLE, SHARED_ROLE, TRAINER_ROLE, Component, JobPlan
from rlkit.slurm.time_limits import format_slurm_time, slurm_time_seconds

# node states in which Slurm will not start new work on a node (scontrol prints e.g. IDLE+DRAIN, DOWN*, MIXED)
_UNUSABLE = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWER_DOWN", "INVAL", "FUTURE", "MAINT",
             "REBOOT_ISSUED")
_GPU_GRES = re.compile(r"gpu(?::[^:(,]+)?:(\d+)")  # gpu:8, gpu:a100:4(S:0-1)


@dataclass(frozen=True)
class Node:
    """What one node offers new jobs (`usable`: not down, drained, failing or in maintenance)."""

    name: str
    cpus: int
    mem_mb: int
    gpus: int
    usable: bool


@dataclass(frozen=True)
class Partition:
    """A partition's limits and its nodes. `max_time_s` None: unlimited. `max_mem_per_node_mb` None: unlimited."""

    name: str
    up: bool
    max_time_s: int | None
    max_nodes: int | None
    max_mem_per_node_mb: int | None
    nodes: tuple[Node, ...]


def gpus_of(gres: str) -> int:
    """The GPU count of a node's Gres field (`gpu:8`, `gpu:a100:4(S:0-1),gpu:v100:2`, `(null)`)."""
    return sum(int(count) for count in _GPU_GRES.findall(gres))


def _int_or_none(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def node_of(record: dict[str, str]) -> Node:
    """One `scontrol show node --oneliner` record."""
    states = set(re.split(r"[+*~#!%$@^-]+", record.get("State", "UNKNOWN").upper()))
    cpus = record.get("CPUEfctv") or record.get("CPUTot") or "0"
    return Node(name=record.get("NodeName", "?"), cpus=int(cpus) if cpus.isdigit() else 0,
                mem_mb=int(record.get("RealMemory", "0") or 0), gpus=gpus_of(record.get("Gres", "")),
                usable=not states.intersection(_UNUSABLE))


def partition_of(record: dict[str, str], nodes: list[dict[str, str]]) -> Partition:
    """A `scontrol show partition --oneliner` record with the node records that list it in their Partitions."""
    name = record.get("PartitionName", "?")
    max_time = record.get("MaxTime", "UNLIMITED")
    try:
        max_time_s = slurm_time_seconds(max_time)
    except ValueError:
        max_time_s = None  # a form rlkit does not read: leave the limit to sbatch
    return Partition(
        name=name, up=record.get("State", "UP") == "UP", max_time_s=max_time_s,
        max_nodes=_int_or_none(record.get("MaxNodes", "UNLIMITED")),
        max_mem_per_node_mb=_int_or_none(record.get("MaxMemPerNode", "UNLIMITED")),
        nodes=tuple(node_of(n) for n in nodes if name in n.get("Partitions", "").split(",")),
    )


def read_partition(name: str) -> tuple[Partition | None, list[str]]:
    """The named partition (the default one for ""), and every partition's name; None when it does not exist or
    the controller cannot be asked (then sbatch --test-only has the last word)."""
    shown = slurm.run_readonly(["scontrol", "show", "partition", "--oneliner"])
    records = slurm.parse_scontrol_records(shown) if shown is not None else []
    names = [r.get("PartitionName", "") for r in records]
    wanted = [r for r in records if (r.get("PartitionName") == name if name else r.get("Default") == "YES")]
    if not wanted:
        return None, names
    members = wanted[0].get("Nodes", "")
    which = [members] if members and members not in ("ALL", "(null)") else []  # only its nodes, on a big cluster
    node_text = slurm.run_readonly(["scontrol", "show", "node", *which, "--oneliner"]) or ""
    return partition_of(wanted[0], slurm.parse_scontrol_records(node_text)), names


def _component_name(component: Component, plan: JobPlan) -> str:
    return f"the {component.label} component" if len(plan.requests) > 1 else "the job"


_FIELDS = {SERVER_ROLE: ("launcher.inference_server_cpus_per_gpu", "launcher.inference_server_mem_per_gpu"),
           AUXILIARY_ROLE: ("launcher.inference_server_cpus_per_gpu", "launcher.inference_server_mem_per_gpu"),
           CLIENT_ROLE: ("launcher.client_cpus", "launcher.client_mem")}
_TRAINER_FIELDS = ("launcher.trainer_cpus_per_gpu", "launcher.trainer_mem_per_gpu")


def _resource_fields(role: str, parts: tuple[str, ...] = ()) -> tuple[str, str]:
    """The launcher fields that size a component's CPUs and memory (an auxiliary model's servers are sized as the
    policy's). The shared request of a packed job adds up the steps on one node: its fields are those of every role
    in `parts` (the plan's components; every role when not given)."""
    if role != SHARED_ROLE:
        return _FIELDS.get(role, _TRAINER_FIELDS)
    roles = parts or (SERVER_ROLE, TRAINER_ROLE, CLIENT_ROLE)
    fields = list(dict.fromkeys(_FIELDS.get(r, _TRAINER_FIELDS) for r in roles if r != SHARED_ROLE))
    return " or ".join(f[0] for f in fields), " or ".join(f[1] for f in fields)


def check_plan(plan: JobPlan, partition: Partition, *, time_limit: str, problems: Problems) -> None:
    """Every way the plan does not fit the partition, added to `problems` (pure)."""
    where = f"partition {partition.name}"
    if not partition.up:
        problems.add(f"{where} is not UP: the job would wait until an administrator brings it back",
                     hint="set launcher.slurm.partition to a partition that is UP (sinfo)")
    if time_limit and partition.max_time_s is not None:
        asked = slurm_time_seconds(time_limit)
        if asked is None or asked > partition.max_time_s:
            problems.add(f"launcher.slurm.time={time_limit} is over the MaxTime of {where} "
                         f"({format_slurm_time(partition.max_time_s)}): Slurm would never start the job",
                         hint=f"set launcher.slurm.time to at most {format_slurm_time(partition.max_time_s)} (the "
                              "job checkpoints and requeues itself at its limit)")
    usable = [n for n in partition.nodes if n.usable]
    parts = tuple(c.role for c in plan.components)
    for component in plan.requests:
        _check_component(_component_name(component, plan), component, partition, usable, problems,
                         _resource_fields(component.role, parts))


def _check_component(name: str, component: Component, partition: Partition, usable: list[Node],
                     problems: Problems, fields: tuple[str, str]) -> None:
    where = f"partition {partition.name}"
    cpu_field, mem_field = fields
    shared = component.role == SHARED_ROLE  # its CPUs and memory per node: the steps on its busiest node, added up
    if not partition.nodes or component.nodelist:
        return  # nodes this user cannot see, or nodes chosen by hand: sbatch --test-only judges those
    cpus = component.ntasks_per_node * component.cpus_per_task
    most_gpus = max(n.gpus for n in partition.nodes)
    most_cpus = max(n.cpus for n in partition.nodes)
    most_mem = max(n.mem_mb for n in partition.nodes)
    fits_alone = True
    if component.gpus_per_node > most_gpus:
        fits_alone = False
        problems.add(f"{name} asks for {component.gpus_per_node} GPUs per node; the nodes of {where} have at most "
                     f"{most_gpus}", hint="set cluster.n_gpus_per_node to the GPUs a node has (sinfo -o '%N %G'), "
                                          "or pick a partition with bigger nodes")
    if cpus > most_cpus:
        fits_alone = False
        how = "its steps on one node" if shared else f"{component.ntasks_per_node} tasks x {component.cpus_per_task}"
        problems.add(f"{name} asks for {cpus} CPUs per node ({how}); the nodes of {where} have at most {most_cpus}",
                     hint=f"lower {cpu_field}")
    mem_limit = min(most_mem, partition.max_mem_per_node_mb or most_mem)
    if component.mem_per_node_mb > mem_limit:
        fits_alone = False
        how = " (its steps on one node)" if shared else ""
        problems.add(f"{name} asks for {component.mem_per_node_mb} MB of memory per node{how}; {where} allows at "
                     f"most {mem_limit} MB", hint=f"lower {mem_field}")
    if partition.max_nodes is not None and component.nodes > partition.max_nodes:
        problems.add(f"{name} needs {component.nodes} nodes; {where} allows at most {partition.max_nodes} per job",
                     hint="lower the layout in allocation_mode, or pick a partition with a larger MaxNodes")
    if not fits_alone:
        return
    fitting = [n for n in usable if n.gpus >= component.gpus_per_node and n.cpus >= cpus
               and n.mem_mb >= component.mem_per_node_mb]
    if len(fitting) < component.nodes:
        down = len([n for n in partition.nodes if not n.usable])
        problems.add(f"{name} needs {component.nodes} nodes with {component.gpus_per_node} GPUs, {cpus} CPUs and "
                     f"{component.mem_per_node_mb} MB each; {where} has {len(fitting)} such nodes that can take "
                     f"work ({len(partition.nodes)} nodes, {down} down, drained or in maintenance)",
                     hint="lower the layout in allocation_mode, or pick a larger partition")


def preflight(plan: JobPlan, *, partition_name: str, time_limit: str) -> Problems:
    """The plan against the live partition; an unknown partition is a problem too."""
    problems = Problems()
    partition, names = read_partition(partition_name)
    if partition is None:
        if partition_name and names:
            problems.add(f"launcher.slurm.partition={partition_name} is not a partition of this cluster",
                         hint=f"use one of: {', '.join(names)}")
        return problems
    check_plan(plan, partition, time_limit=time_limit, problems=problems)
    return problems
