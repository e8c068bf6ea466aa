"""The site preflight's checks (pure), on records in the form `scontrol show partition/node --oneliner` prints
(taken from the dev cluster's Slurm 22.05, then varied: a time limit, drained nodes, GPU types, a partition DOWN)."""

from __future__ import annotations

import pytest

from rlkit.config.problems import Problems
from rlkit.launch.plan import Component, JobPlan
from rlkit.launch.preflight import Partition, check_plan, gpus_of, partition_of
from rlkit.launch.slurm import parse_scontrol_records

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
