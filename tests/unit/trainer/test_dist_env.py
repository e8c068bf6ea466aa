"""The trainer's rank layout from the environment, and the rank-0 address rendezvous through name resolve."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from rlkit.errors import StepError
from rlkit.nameresolve import NfsNameResolve
from rlkit.trainer.dist import DistEnv, dist_env_from, rendezvous, rendezvous_key

SLURM = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_NTASKS": "9", "SLURM_LOCALID": "1",
         "SLURM_JOB_ID": "1234", "SLURM_STEP_ID": "2"}


# --- dist_env_from ----------------------------------------------------------------------------------------------

def test_torchrun_variables_win_over_slurm() -> None:
    env = dist_env_from({**SLURM, "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "node7",
                         "MASTER_PORT": "4321"})
    assert env == DistEnv(rank=1, world_size=2, local_rank=1, master_addr="node7", master_port=4321)


def test_torchrun_defaults() -> None:
    assert dist_env_from({"RANK": "0", "WORLD_SIZE": "1"}) == DistEnv(0, 1, 0, "127.0.0.1", 29500)


def test_slurm_step_rank_and_world_with_empty_address() -> None:
    assert dist_env_from(SLURM) == DistEnv(rank=3, world_size=4, local_rank=1, master_addr="", master_port=0)


def test_slurm_world_falls_back_to_ntasks_then_one() -> None:
    assert dist_env_from({"SLURM_PROCID": "0", "SLURM_NTASKS": "6"}).world_size == 6
    assert dist_env_from({"SLURM_PROCID": "0"}) == DistEnv(0, 1, 0, "", 0)


def test_only_rank_without_world_size_is_not_torchrun() -> None:
    assert dist_env_from({"RANK": "5", **SLURM}).rank == 3


def test_nothing_is_a_single_process() -> None:
    assert dist_env_from({}) == DistEnv(rank=0, world_size=1, local_rank=0, master_addr="127.0.0.1",
                                        master_port=29500)
    assert dist_env_from({"MASTER_PORT": "2000"}).master_port == 2000


def test_rendezvous_key_names_job_and_step() -> None:
    assert rendezvous_key(SLURM) == "trainer/master/1234.2"
    assert rendezvous_key({}) == "trainer/master/0.0"


# --- rendezvous -------------------------------------------------------------------------------------------------

@pytest.fixture
def two_nodes(tmp_path: Path):
    """Two resolvers on one record root, as rank 0 and rank 1 on different nodes would have."""
    a = NfsNameResolve(tmp_path, "exp", "trial", ttl=5.0, heartbeat_interval=1.0)
    b = NfsNameResolve(tmp_path, "exp", "trial", ttl=5.0, heartbeat_interval=1.0)
    yield a, b
    a.close()
    b.close()


@pytest.mark.parametrize("host", ["gpu-node-17", "fe80::1"])
def test_rank0_publishes_and_rank1_reads_the_same_address(two_nodes: tuple[NfsNameResolve, NfsNameResolve],
                                                          monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    nr0, nr1 = two_nodes
    monkeypatch.setenv("RLKIT_ADVERTISE_HOST", host)
    key = "trainer/master/1234.2"
    env0 = rendezvous(DistEnv(0, 2, 0, "", 0), nr0, key, timeout_s=5.0)
    assert env0.master_addr == host
    assert 0 < env0.master_port < 65536
    assert (env0.rank, env0.world_size, env0.local_rank) == (0, 2, 0)
    assert nr1.get(key) == f"{host}:{env0.master_port}"
    env1 = rendezvous(DistEnv(1, 2, 1, "", 0), nr1, key, timeout_s=5.0)
    assert env1 == DistEnv(1, 2, 1, host, env0.master_port)


def test_rank1_waits_for_rank0(two_nodes: tuple[NfsNameResolve, NfsNameResolve],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    nr0, nr1 = two_nodes
    monkeypatch.setenv("RLKIT_ADVERTISE_HOST", "head")
    key = "trainer/master/7.0"
    got: list[DistEnv] = []
    waiter = threading.Thread(target=lambda: got.append(rendezvous(DistEnv(1, 2, 0, "", 0), nr1, key, 10.0)))
    waiter.start()
    env0 = rendezvous(DistEnv(0, 2, 0, "", 0), nr0, key, timeout_s=5.0)
    waiter.join(timeout=15)
    assert not waiter.is_alive()
    assert got == [DistEnv(1, 2, 0, "head", env0.master_port)]


def test_rank1_times_out_naming_the_key(two_nodes: tuple[NfsNameResolve, NfsNameResolve]) -> None:
    _, nr1 = two_nodes
    with pytest.raises(StepError, match=r"trainer/master/9\.9"):
        rendezvous(DistEnv(1, 2, 0, "", 0), nr1, "trainer/master/9.9", timeout_s=0.3)


def test_rank0_replaces_a_leftover_address(two_nodes: tuple[NfsNameResolve, NfsNameResolve],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    nr0, nr1 = two_nodes
    key = "trainer/master/5.0"
    nr1.add(key, "old-host:1")
    monkeypatch.setenv("RLKIT_ADVERTISE_HOST", "new-host")
    env0 = rendezvous(DistEnv(0, 2, 0, "", 0), nr0, key, timeout_s=5.0)
    assert nr1.get(key) == f"new-host:{env0.master_port}"


def test_end_process_runs_atexit_flushes_output_and_keeps_the_code(tmp_path: Path) -> None:
    """`rlkit train` ends through end_process: the exit code, atexit handlers (metric sinks register some) and
    buffered output must survive skipping interpreter teardown."""
    import subprocess
    import sys

    script = (
        "import atexit, sys\n"
        "from rlkit.trainer.dist import end_process\n"
        f"atexit.register(lambda: open({str(tmp_path / 'atexit')!r}, 'w').write('ran'))\n"
        "sys.stdout.write('buffered, no newline')\n"
        "end_process(3)\n"
        "print('not reached')\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stderr
    assert result.stdout == "buffered, no newline"
    assert (tmp_path / "atexit").read_text() == "ran"


# --- rank 0's broadcasts wait as long as rank 0 may work alone ------------------------------------------------------

SLOW_RANK0 = """
import sys, time
from rlkit.trainer import dist as rdist

wait = None if sys.argv[1] == "none" else float(sys.argv[1])
env, _ = rdist.init_distributed(None, timeout_s=1.0, rank0_wait_s=wait)
if env.rank == 0:
    time.sleep(2.0)  # rank 0 alone past the collective timeout, as with a slow batch of rollouts
print("got", rdist.broadcast_object("the batch" if env.rank == 0 else None), flush=True)
assert rdist.all_reduce_max(env.rank) == 1  # the default group is still the trainer's
rdist.end_process(0)
"""


def test_the_other_ranks_wait_for_rank_0_past_the_collective_timeout() -> None:
    """A batch broadcast by rank 0 after longer than the process group's timeout (1 s here, 30 minutes in a trainer)
    reaches the other ranks, which wait rank0_wait_s for it instead of failing with torch's timeout."""
    from tests.helpers.gloo_ranks import run_ranks

    outputs = run_ranks(2, ["-c", SLOW_RANK0, "20"])
    assert all("got the batch" in output for output in outputs), outputs


def test_rank0_wait_bound_covers_rank_0s_own_deadlines(grpo_yaml: Path) -> None:
    from rlkit.config.load import load_config
    from rlkit.jobs.grpo.waits import batch_wait_s, push_wait_s, rank0_wait_bound
    from rlkit.trainer.dist import COLLECTIVE_TIMEOUT_S

    config = load_config(grpo_yaml, ["rollout.request_timeout=3000", "rollout.request_retries=2",
                                     "actor.weight_update_timeout=100", "rollout.setup_timeout=500"])
    assert batch_wait_s(config) == 3000 * 3 + 0.5 + 1 + 60  # get_batch's own deadline
    assert push_wait_s(config) == 2 * (2 * 100 + 60) + 3000  # the probe may queue behind generation
    bound = rank0_wait_bound(config)
    assert bound >= batch_wait_s(config) + push_wait_s(config) + 3000  # the batch, a push, an evaluation's request
    assert bound > COLLECTIVE_TIMEOUT_S  # the defaults' request_timeout alone outlasts a collective
    assert rank0_wait_bound(config, scored=True) >= bound + batch_wait_s(config)  # distill: the teacher scores too


def test_rank0_wait_bound_counts_the_last_steps_two_evaluations_of_an_agent_run(grpo_yaml: Path) -> None:
    """After the last step's push rank 0 may wait for the evaluation still running and then for the final weights'
    (Evaluator.after_step, each eval_wait_bound) before the loop's next broadcast: for an agent run each of those is
    max_turns turns, so one evaluation's wait in the sum falls short."""
    from rlkit.config.load import load_config
    from rlkit.jobs.grpo.waits import push_wait_s, rank0_wait_bound
    from rlkit.trainer.evaluator import eval_wait_bound

    config = load_config(grpo_yaml, [])
    config.rollout.agent.workflow, config.rollout.agent.max_turns = "my_agents.episode:run", 20
    assert eval_wait_bound(config) >= 20 * config.rollout.request_timeout
    assert rank0_wait_bound(config) >= push_wait_s(config) + 2 * eval_wait_bound(config)


def test_an_agent_run_waits_for_a_batch_of_max_turns_turns(grpo_yaml: Path) -> None:
    """A batch of episodes may take max_turns turns, each a request with its retries and its tool calls: a healthy
    run of long turns failed rank 0's batch wait (one request's bound) first."""
    from rlkit.config.load import load_config
    from rlkit.jobs.grpo.waits import batch_wait_s

    config = load_config(grpo_yaml, ["rollout.request_timeout=100", "rollout.request_retries=1"])
    single = batch_wait_s(config)
    config.rollout.agent.workflow, config.rollout.agent.max_turns = "my_agents.episode:run", 6
    config.rollout.agent.tool_timeout = 30
    assert batch_wait_s(config) == 6 * (single - 60 + 30) + 60


def test_trainer_waits_outlast_one_bucket_of_a_broadcast_push(grpo_yaml: Path) -> None:
    """While rank 0 waits for the servers' part of one bucket, the other ranks wait in the next bucket's all-gather:
    a long weight_update_timeout raises it, else it stays 30 minutes."""
    from rlkit.config.load import load_config
    from rlkit.jobs.grpo.waits import rank0_wait_bound, trainer_waits
    from rlkit.trainer.dist import COLLECTIVE_TIMEOUT_S

    config = load_config(grpo_yaml, [])
    assert trainer_waits(config).collective_s == COLLECTIVE_TIMEOUT_S
    assert trainer_waits(config).rank0_s == rank0_wait_bound(config)
    slow = load_config(grpo_yaml, ["actor.weight_update_timeout=3000"])
    assert trainer_waits(slow).collective_s == 2 * (3000 + 2 * 30) + 60
