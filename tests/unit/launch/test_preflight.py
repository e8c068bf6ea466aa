"""The site preflight's checks (pure), on records in the form `scontrol show partition/node --oneliner` prints
(taken from the dev cluster's Slurm 22.05, then varied: a time limit, drained nodes, GPU types, a partition DOWN)."""

from __future__ import annotations

import pytest

from rlkit.config.load import load_config
from rlkit.config.problems import Problems
from rlkit.launch.plan import AUXILIARY_ROLE, CLIENT_ROLE, SERVER_ROLE, SHARED_ROLE, TRAINER_ROLE, Component, JobPlan
from rlkit.launch.preflight import Partition, _resource_fields, check_plan, gpus_of, partition_of
from rlkit.launch.slurm import parse_scontrol_records
from tests.conftest import CONFIGS
from tests.helpers.planning import plan_of

PARTITION = ("PartitionName=gpu AllowGroups=ALL Default=YES MaxNodes=UNLIMITED MaxTime=2-00:00:00 MinNodes=0 "
             "Nodes=node[1-4] State=UP TotalCPUs=256 TotalNodes=4 DefMemPerNode=UNLIMITED MaxMemPerNode=UNLIMITED")
NODE = ("NodeName={name} Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 CPUEfctv=64 CPUTot=64 CPULoad=0.61 "
        "Gres={gres} NodeAddr=127.0.0.1 RealMemory=512000 AllocMem=0 FreeMem=21425 Sockets=64 State={state} "
        "Partitions={partitions}  CfgTRES=cpu=64,mem=500G,billing=64")


def partition(text: str = PARTITION, states: tuple[str, ...] = ("IDLE", "MIXED", "IDLE+DRAIN", "DOWN*"),
              gres: str = "gpu:a100:8(S:0-1)") -> Partition:
    nodes = "\n".join(NODE.format(name=f"node{i + 1}", gres=gres, state=state, partitions="gpu,debug")
                      for i, state in enumerate(states))
    other = NODE.format(name="big", gres="gpu:16", state="IDLE", partitions="other")
    (record,) = parse_scontrol_records(text)
    return partition_of(record, parse_scontrol_records(nodes + "\n" + other))


def plan(*components: Component) -> JobPlan:
    return JobPlan(job_name="j", trial_dir="/t", batch_log="/t/log", components=components, steps=(), job_options=(),
                   component_options=(), container_type="none", apptainer_args=(), binds=(), srun_args=())


def problems_of(job: JobPlan, part: Partition, time_limit: str = "") -> list[str]:
    problems = Problems()
    check_plan(job, part, time_limit=time_limit, problems=problems)
    return [f"{e.message} | {e.hint}" for e in problems.errors]


@pytest.mark.parametrize(("gres", "gpus"), [("gpu:8", 8), ("gpu:a100:4(S:0-1)", 4), ("gpu:a100:4,gpu:v100:2", 6),
                                            ("(null)", 0), ("", 0), ("shard:8", 0)])
def test_gpu_count_of_the_gres_forms(gres: str, gpus: int) -> None:
    assert gpus_of(gres) == gpus


def test_partition_record_and_its_nodes() -> None:
    part = partition()
    assert (part.name, part.up, part.max_time_s, part.max_nodes, part.max_mem_per_node_mb) == ("gpu", True, 172800,
                                                                                                None, None)
    assert [n.name for n in part.nodes] == ["node1", "node2", "node3", "node4"], "node 'big' is in another partition"
    assert [n.usable for n in part.nodes] == [True, True, False, False]
    assert {n.gpus for n in part.nodes} == {8}


def test_a_layout_that_fits_has_no_problem() -> None:
    fits = plan(Component("server", 1, 2, 8, 16, 200000), Component("trainer", 2, 8, 8, 4, 256000))
    assert problems_of(fits, partition(states=("IDLE",) * 4), time_limit="1-00:00:00") == []


def test_every_mismatch_of_every_component_is_named_with_its_field() -> None:
    too_big = plan(Component("server", 1, 1, 16, 4, 1000), Component("trainer", 1, 8, 8, 10, 600000))
    found = problems_of(too_big, partition(), time_limit="3-00:00:00")
    assert len(found) == 4, found
    assert "launcher.slurm.time=3-00:00:00 is over the MaxTime of partition gpu (2-00:00:00)" in found[0]
    assert "the server component asks for 16 GPUs per node; the nodes of partition gpu have at most 8" in found[1]
    assert "cluster.n_gpus_per_node" in found[1]
    assert "the trainer component asks for 80 CPUs per node (8 tasks x 10)" in found[2]
    assert "launcher.trainer_cpus_per_gpu" in found[2]
    assert "600000 MB of memory per node; partition gpu allows at most 512000 MB" in found[3]
    assert "launcher.trainer_mem_per_gpu" in found[3]


def test_nodes_that_cannot_take_work_do_not_count() -> None:
    """Four nodes, of which one is drained and one down: a 3-node trainer would wait forever."""
    found = problems_of(plan(Component("trainer", 3, 8, 8, 1, 1000)), partition())
    assert len(found) == 1 and "needs 3 nodes with 8 GPUs, 8 CPUs and 1000 MB each; partition gpu has 2 such " \
                               "nodes that can take work (4 nodes, 2 down, drained or in maintenance)" in found[0]
    assert problems_of(plan(Component("trainer", 2, 8, 8, 1, 1000)), partition()) == []


def test_partition_limits_down_maxnodes_maxmem() -> None:
    text = PARTITION.replace("State=UP", "State=DOWN").replace("MaxNodes=UNLIMITED", "MaxNodes=1").replace(
        "MaxMemPerNode=UNLIMITED", "MaxMemPerNode=64000").replace("MaxTime=2-00:00:00", "MaxTime=UNLIMITED")
    found = problems_of(plan(Component("client", 2, 1, 0, 1, 100000)), partition(text, states=("IDLE",) * 4),
                        time_limit="30-00:00:00")
    assert "partition gpu is not UP" in found[0]
    assert "asks for 100000 MB of memory per node; partition gpu allows at most 64000 MB" in found[1]
    assert "launcher.client_mem" in found[1]
    assert "needs 2 nodes; partition gpu allows at most 1 per job" in found[2]
    assert len(found) == 3, found  # MaxTime UNLIMITED: any time limit is fine


def test_hand_picked_nodes_are_left_to_slurm() -> None:
    """With launcher.slurm.nodelist the component's nodes are named: sbatch --test-only judges them."""
    assert problems_of(plan(Component("trainer", 3, 8, 8, 1, 1000, nodelist="node1,node2,node3")), partition()) == []


# ---- a packed plan: its one node request is checked, named "the job", with every field that adds up into it --------

PINNED = ["launcher.python=/opt/rlkit/bin/python", "actor.path=/storage/models/m", "cluster.fileroot=/storage/rlkit"]


def packed_plan(source: str, *overrides: str) -> JobPlan:
    packed = plan_of(load_config(CONFIGS / f"{source}.yaml", [*PINNED, *overrides]))
    assert packed.packed and len(packed.components) == 2, packed.components
    return packed


def test_a_packed_plan_is_checked_as_its_one_request() -> None:
    """The CPU demo on one node of 4 GPUs: servers and trainer ranks add up to 4 GPUs, 4 CPUs and 16 GB on node1;
    the components alone (server, trainer) are not what the job asks of any node."""
    one_node = packed_plan("grpo-cpu-demo", "cluster.n_nodes=1", "cluster.n_gpus_per_node=4")
    assert (one_node.shared and one_node.requests == (one_node.shared,)
            and (one_node.shared.nodes, one_node.shared.gpus_per_node) == (1, 4))
    one_usable = partition(text=PARTITION.replace("MaxNodes=UNLIMITED", "MaxNodes=1"),
                           states=("IDLE", "DOWN*", "DOWN*", "DOWN*"), gres="gpu:4")
    assert problems_of(one_node, one_usable) == []
    found = problems_of(one_node, partition(states=("IDLE",) * 4, gres="gpu:2"))
    assert found == ["the job asks for 4 GPUs per node; the nodes of partition gpu have at most 2 | set "
                     "cluster.n_gpus_per_node to the GPUs a node has (sinfo -o '%N %G'), or pick a partition with "
                     "bigger nodes"], found


def test_a_packed_plan_s_cpus_and_memory_per_node_name_every_field_that_adds_up() -> None:
    heavy = packed_plan("grpo-one-node-cpu-demo", "launcher.inference_server_cpus_per_gpu=40",
                        "launcher.trainer_cpus_per_gpu=20", "launcher.inference_server_mem_per_gpu=300000")
    found = problems_of(heavy, partition(states=("IDLE",) * 4))
    assert found == [
        "the job asks for 120 CPUs per node (its steps on one node); the nodes of partition gpu have at most 64 | "
        "lower launcher.inference_server_cpus_per_gpu or launcher.trainer_cpus_per_gpu",
        "the job asks for 608192 MB of memory per node (its steps on one node); partition gpu allows at most 512000 "
        "MB | lower launcher.inference_server_mem_per_gpu or launcher.trainer_mem_per_gpu"], found


def test_a_packed_plan_needs_its_nodes_with_all_its_steps_resources() -> None:
    """12 server GPUs and 4 trainer GPUs on two nodes of 8: both nodes must take the busiest node's share."""
    two_nodes = packed_plan("grpo", "allocation_mode=vllm:d12+fsdp:d4", "cluster.n_nodes=2",
                            "cluster.n_gpus_per_node=8")
    assert problems_of(two_nodes, partition()) == []  # node1 and node2 can take work
    found = problems_of(two_nodes, partition(states=("IDLE", "DOWN*", "IDLE+DRAIN", "DOWN*")))
    assert found == ["the job needs 2 nodes with 8 GPUs, 32 CPUs and 262144 MB each; partition gpu has 1 such nodes "
                     "that can take work (4 nodes, 3 down, drained or in maintenance) | lower the layout in "
                     "allocation_mode, or pick a larger partition"], found
    text = PARTITION.replace("MaxNodes=UNLIMITED", "MaxNodes=1")
    assert problems_of(two_nodes, partition(text, states=("IDLE",) * 4)) == [
        "the job needs 2 nodes; partition gpu allows at most 1 per job | lower the layout in allocation_mode, or "
        "pick a partition with a larger MaxNodes"]


def test_the_shared_request_s_fields_are_those_of_the_roles_on_its_nodes() -> None:
    assert _resource_fields(SHARED_ROLE, (SERVER_ROLE, AUXILIARY_ROLE, CLIENT_ROLE)) == (
        "launcher.inference_server_cpus_per_gpu or launcher.client_cpus",
        "launcher.inference_server_mem_per_gpu or launcher.client_mem")
    assert _resource_fields(SHARED_ROLE) == (
        "launcher.inference_server_cpus_per_gpu or launcher.trainer_cpus_per_gpu or launcher.client_cpus",
        "launcher.inference_server_mem_per_gpu or launcher.trainer_mem_per_gpu or launcher.client_mem")
    assert _resource_fields(AUXILIARY_ROLE) == _resource_fields(SERVER_ROLE)
    assert _resource_fields(TRAINER_ROLE) == ("launcher.trainer_cpus_per_gpu", "launcher.trainer_mem_per_gpu")
