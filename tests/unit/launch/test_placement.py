"""Placement (rlkit.launch.placement, through the planner): which layouts keep the heterogeneous job, which share
nodes (one allocation, each step on its node with its own GPU slice), which fit no placement; and the script a packed
plan renders to."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from rlkit.config.load import load_config
from rlkit.errors import ConfigError
from rlkit.launch.plan import CLIENT_ROLE, JobPlan
from rlkit.launch.render import render_script
from tests.conftest import CONFIGS
from tests.helpers.planning import plan_of

# Fixed values so nothing depends on this machine (as the golden tests' PINNED).
PINNED = ["launcher.python=/opt/rlkit/bin/python", "actor.path=/storage/models/m",
          "generate.dataset.path=/storage/data/p.jsonl", "cluster.fileroot=/storage/rlkit"]
GPU8 = ["cluster.n_gpus_per_node=8"]


def _plan(source: str, overrides: list[str]) -> JobPlan:
    return plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides]))


def _slices(plan: JobPlan) -> list[tuple[str, int | None, int, int]]:
    """Each step's (name, first node, nodes, GPUs per node); the first node counts within the job when packed,
    within its component when heterogeneous (None: the component's first)."""
    return [(s.name, s.relative_node, s.nodes, s.gpus_per_node) for s in plan.steps]


def _servers(first: int, count: int, node: int, gpus: int) -> list[tuple[str, int | None, int, int]]:
    return [(f"server-{i}", node, 1, gpus) for i in range(first, first + count)]


# name: (config, overrides, kind, nodes of the job, each step's slice)
LAYOUTS = {
    # AReaL's examples/math/gsm8k_grpo.yaml: 4 GPUs serve, 4 train, one node of 8
    "areal-one-node": ("grpo", ["allocation_mode=sglang:d4p1t1+fsdp:d4p1t1", "cluster.n_nodes=1", *GPU8],
                       "packed", 1, [*_servers(0, 4, 0, 1), ("grpo", 0, 1, 4)]),
    # the same layout given two nodes: whole nodes per component would take both, sharing takes one
    "areal-two-nodes-given": ("grpo", ["allocation_mode=sglang:d4+fsdp:d4", "cluster.n_nodes=2", *GPU8],
                              "packed", 1, [*_servers(0, 4, 0, 1), ("grpo", 0, 1, 4)]),
    # 12 server GPUs do not fill whole nodes of 8: the trainer's 4 on node 0, 4 servers beside it, 8 on node 1
    "12+4": ("grpo", ["allocation_mode=vllm:d12+fsdp:d4", "cluster.n_nodes=2", *GPU8],
             "packed", 2, [*_servers(0, 4, 0, 1), *_servers(4, 8, 1, 1), ("grpo", 0, 1, 4)]),
    # a trainer over one node takes whole nodes from node 0 (its rank 0 on the job's first node); servers after it
    "trainer-whole-nodes": ("grpo", ["allocation_mode=vllm:d12+fsdp:d16", "cluster.n_nodes=4", *GPU8],
                            "packed", 4, [*_servers(0, 8, 2, 1), *_servers(8, 4, 3, 1), ("grpo", 0, 2, 8)]),
    # every component fills whole nodes and sharing saves no GPU node: today's heterogeneous job
    "grpo-example": ("grpo", [], "heterogeneous", 2, [*_servers(0, 4, 0, 2), ("grpo", None, 1, 8)]),
    # the CPU demo, one GPU per node: a node per server, the trainer's two ranks on two more
    "cpu-demo": ("grpo-cpu-demo", [], "heterogeneous", 4,
                 [("server-0", 0, 1, 1), ("server-1", 1, 1, 1), ("grpo", None, 2, 1)]),
    # generate (a GPU-less client, no trainer) on one node: the client joins the servers' node, with no GPU
    "generate-one-node": ("generate-gpu", ["cluster.n_nodes=1"], "packed", 1,
                          [*_servers(0, 4, 0, 2), ("generate", 0, 1, 0)]),
    # ... given a second node, the client takes it (packing would save no GPU node)
    "generate-two-nodes": ("generate-gpu", [], "heterogeneous", 2, [*_servers(0, 4, 0, 2), ("generate", None, 1, 0)]),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_layouts_are_placed_by_the_one_rule(name: str) -> None:
    source, overrides, kind, nodes, slices = LAYOUTS[name]
    plan = _plan(source, overrides)
    assert ("packed" if plan.packed else "heterogeneous") == kind
    assert sum(r.nodes for r in plan.requests) == nodes
    assert _slices(plan) == slices
    if plan.packed:  # the one request holds, per node, what its steps take together
        per_node = [0] * nodes
        for step in plan.steps:
            for node in range(step.relative_node or 0, (step.relative_node or 0) + step.nodes):
                per_node[node] += step.gpus_per_node
        assert plan.requests[0].gpus_per_node == max(per_node) <= 8
        # the script's notes say why, and each step's node and slice (what `rlkit render` shows)
        assert any(note.startswith("placement: packed, one allocation of") for note in plan.notes)
        for step in plan.steps:
            assert any(note.strip().startswith(f"{step.name}: node") and f"{step.gpus_per_node} GPU(s)" in note
                       for note in plan.notes), step.name
    else:
        assert not any(note.startswith("placement:") for note in plan.notes)


@pytest.mark.parametrize(("overrides", "says", "hint"), [
    (["allocation_mode=vllm:d1t16+fsdp:d8", "cluster.n_nodes=4"], "one server needs 16 GPUs but a node has 8",
     "lower the tensor-parallel size"),
    (["allocation_mode=vllm:d4t2+fsdp:d12", "cluster.n_nodes=4"],
     "the trainer's 12 GPUs span more than one node, so they must fill whole nodes of 8 GPUs", "use a multiple of 8"),
    (["allocation_mode=vllm:d12+fsdp:d4", "cluster.n_nodes=1"],
     "needs 2 nodes of 8 GPUs (12 server + 4 trainer GPUs, placed 8, 8 per node) but cluster.n_nodes is 1",
     "set cluster.n_nodes=2 or use fewer GPUs"),
    (["allocation_mode=sglang:d4+fsdp:d8", "cluster.n_nodes=1"],
     "needs 2 nodes of 8 GPUs (4 server + 8 trainer GPUs, placed 8, 4 per node) but cluster.n_nodes is 1",
     "set cluster.n_nodes=2 or use fewer GPUs"),
    (["allocation_mode=vllm:d40+fsdp:d8", "cluster.n_nodes=1", "cluster.n_gpus_per_node=2"],  # 24 nodes: 16 shown
     "(40 server + 8 trainer GPUs, placed 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, ... (24 nodes) per node)",
     "set cluster.n_nodes=24"),
    (["allocation_mode=vllm:d2+fsdp:d999999999992"],  # refused before placing: its list alone would not fit in memory
     "needs 999,999,999,994 GPUs but the cluster has 2 nodes of 8 GPUs (16 GPUs)", "set cluster.n_nodes=125000000000"),
])
def test_a_layout_that_fits_no_placement_is_refused_with_its_fix(overrides: list[str], says: str, hint: str) -> None:
    with pytest.raises(ConfigError) as info:
        _plan("grpo", overrides)
    assert says in info.value.message
    assert info.value.hint is not None and info.value.hint.startswith(hint)


# ---- the script of a packed plan ------------------------------------------------------------------------------------

PACKED_LAYOUTS = ["areal-one-node", "12+4", "trainer-whole-nodes", "generate-one-node"]


def _functions(script: str, prefix: str) -> dict[str, list[str]]:
    """Each bash function `<prefix>...() {` / one command line / `}`: its name -> the command parsed as bash will."""
    lines = script.splitlines()
    return {line[: -len("() {")]: shlex.split(lines[i + 1]) for i, line in enumerate(lines)
            if line.startswith(prefix) and line.endswith("() {")}


def _option(argv: list[str], name: str) -> str | None:
    """The value of srun's `--name=value` (the srun's own options, before the python it runs)."""
    srun = argv[argv.index("srun"):]
    values = [a.split("=", 1)[1] for a in srun[: srun.index("-m") if "-m" in srun else len(srun)]
              if a.startswith(f"--{name}=")]
    return values[0] if values else None


@pytest.mark.parametrize("name", PACKED_LAYOUTS)
def test_a_packed_plan_renders_one_job_each_step_on_its_slice(name: str) -> None:
    source, overrides, *_ = LAYOUTS[name]
    plan = _plan(source, overrides)
    script = render_script(plan)
    assert "hetjob" not in script and "--het-group" not in script
    assert "\nPACKED=1 " in script
    assert "#SBATCH --ntasks-per-node" not in script  # each step sets its own task count
    request = plan.requests[0]
    assert f"#SBATCH --nodes={request.nodes}\n" in script and f"#SBATCH --gres=gpu:{request.gpus_per_node}\n" in script

    commands = _functions(script, "cmd_")
    assert len(commands) == len(plan.steps)
    for step in plan.steps:
        argv = commands["cmd_" + step.name.replace("-", "_")]
        assert _option(argv, "relative") == str(step.relative_node), step.name
        assert _option(argv, "nodes") == str(step.nodes) and _option(argv, "ntasks") == str(step.ntasks)
        assert _option(argv, "gres") == (f"gpu:{step.gpus_per_node}" if step.gpus_per_node else "none"), step.name
        assert "--exact" in argv
        if step.role == CLIENT_ROLE:
            assert _option(argv, "gres") == "none"  # else it would get every GPU of its node

    # step 0: one check per step, on that step's nodes with that step's slice
    checks = list(_functions(script, "node_check_").values())
    assert f"NODE_CHECKS=({' '.join(f'node_check_{i}' for i in range(len(plan.steps)))})" in script
    assert len(checks) == len(plan.steps)
    for step, check in zip(plan.steps, checks, strict=True):
        assert _option(check, "relative") == str(step.relative_node)
        assert _option(check, "nodes") == str(step.nodes) and _option(check, "ntasks") == str(step.nodes)
        assert _option(check, "gres") == (f"gpu:{step.gpus_per_node}" if step.gpus_per_node else "none")
        assert f"--gpus={step.gpus_per_node}" in check
    # the work step's check (last) listens for every other check's task, each one connects to it
    listen = [a for a in checks[-1] if a.startswith("--listen=")]
    tasks = [int(_option(check, "ntasks") or 0) for check in checks]
    assert listen == [f"--listen={sum(tasks) - 1}"]
    if tasks[-1] == 1:
        assert sum(tasks[:-1]) == sum(tasks) - 1
    assert all(not any(a.startswith("--listen=") for a in check) for check in checks[:-1])

    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    run = subprocess.run(["shellcheck", "--shell=bash", "-"], input=script, capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stdout


def test_a_heterogeneous_plan_keeps_its_components() -> None:
    script = render_script(_plan("grpo", []))
    assert script.count("#SBATCH hetjob") == 1 and "\nPACKED=0 " in script
    assert "--het-group=0" in script and "--het-group=1" in script and "--gres=none" not in script
