"""rlkit.slurm.jobenv: what Slurm tells a step, read in one place."""

from __future__ import annotations

from rlkit.slurm.jobenv import JobEnv

STEP = {"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "9",
        "SLURM_NODEID": "1", "SLURMD_NODENAME": "node7", "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "2",
        "SLURM_RESTART_COUNT": "1", "SLURM_STEP_NODELIST": "node[6-7]", "SLURM_JOB_NODELIST": "node[1-9]"}


def test_a_step_task_reads_its_place() -> None:
    env = JobEnv.from_environ(STEP)
    assert env == JobEnv(in_step=True, global_rank=3, local_rank=1, world_size=4, node_index=1, node_name="node7",
                         job_id="1234", step_id="2", restart_count=1, nodelist="node[6-7]")


def test_the_batch_script_knows_only_the_job() -> None:
    env = JobEnv.from_environ({"SLURM_JOB_ID": "5", "SLURM_NTASKS": "6", "SLURM_JOB_NODELIST": "a,b"})
    assert (env.in_step, env.global_rank, env.world_size, env.nodelist) == (False, 0, 6, "a,b")


def test_outside_slurm_one_process_with_empty_ids() -> None:
    env = JobEnv.from_environ({"SLURM_RESTART_COUNT": ""})
    assert (env.in_step, env.global_rank, env.local_rank, env.world_size, env.job_id, env.step_id,
            env.restart_count, env.nodelist) == (False, 0, 0, 1, "", "", 0, "")
    assert env.node_name  # this host's name
