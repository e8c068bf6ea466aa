"""Where trainer rank 0 of an RL job works alone (the servers registering at start, a running evaluation before a
push), the other ranks wait for it in its broadcast group (rlkit.jobs.grpo.waits: rank0_wait_bound), not in the
next collective of the process group, whose timeout (30 minutes) is shorter than rank 0's own deadlines
(rollout.setup_timeout x 2 with auxiliary models, rollout.request_timeout: an hour by default)."""

from __future__ import annotations

import pytest

SCRIPT = """
import sys, time
from types import SimpleNamespace
import torch, torch.distributed as dist
from rlkit.config.schema.evaluation import EvaluatorConfig
from rlkit.errors import StepError
from rlkit.jobs.grpo import algorithm as grpo
from rlkit.jobs.grpo.rank0 import Rank0
from rlkit.trainer import dist as rdist
from rlkit.weights import fanout

slow = sys.argv[1]  # where rank 0 works alone past the collective timeout (1 s here)
env, _ = rdist.init_distributed(None, timeout_s=1.0, rank0_wait_s=30.0)

def collective():  # as FSDP's all-gathers in the probe's forward and in each bucket of a push
    t = torch.ones(1)
    dist.all_reduce(t)

class Engine:
    def probe_logprobs(self, probe):
        collective()
        return [0.0]

    def iter_full_buckets(self, size, dtype):
        for _ in range(2):
            collective()
            yield []

class Transport:
    adapters_only, bucket_bytes, timings, sent_bytes = False, 1, {}, 0
    def bucket_dtype(self):
        return None

def publish(transport, buckets, version, targets, probe):  # the servers' part of a push: none here
    for _ in buckets:
        pass
    return fanout.Published([]) if targets is not None else None

class Evaluator:
    def wait_before_push(self):  # an evaluation still running (at most rollout.request_timeout)
        time.sleep(2.0 if slow == "push" else 0.0)
        return 0.0

class AloneRank0(Rank0):  # the real publish around servers and an evaluator of its own
    def __init__(self, *args):
        self.evaluator, self.version = Evaluator(), 0
        self.controller = SimpleNamespace(live_servers=lambda: ["server 0"], end_update=lambda version: None)
    def start(self, transport):  # the servers registering (rollout.setup_timeout each)
        if slow == "fail":
            raise StepError("waited 1200 s for 2 inference servers to register")
        time.sleep(2.0 if slow == "start" else 0.0)
    def verify(self, probe, trainer_lp):
        pass
    def _targets(self, servers):
        return SimpleNamespace()
    def _probe(self, probe, trainer_lp):
        return None
    def _record(self, version, servers, published):
        pass

fanout.publish = publish
grpo.mismatch_temperature = lambda config, announce: None
grpo.transport_for_actor = lambda actor: lambda config, paths: Transport()
algo = object.__new__(grpo.GRPO)
algo.config, algo.paths, algo.rank0 = SimpleNamespace(evaluator=EvaluatorConfig(), actor=None), None, env.rank == 0
algo.actor, algo.probe = SimpleNamespace(engine=Engine()), [1]
algo.tokenizer, algo.prompts, algo.total_steps = None, [], 1
algo.rank0_class, algo.trainer = AloneRank0, None
algo.start(None)
grpo._check_weights(algo.actor.engine, algo.trainer, algo.transport, [1], version=1, push=True)
print("pushed", flush=True)
rdist.end_process(0)
"""


@pytest.mark.parametrize("slow", ["start", "push"])
def test_the_other_ranks_wait_for_rank_0_alone_in_its_broadcast_group(slow: str) -> None:
    from tests.helpers.gloo_ranks import run_ranks

    outputs = run_ranks(2, ["-c", SCRIPT, slow])
    assert all("pushed" in output for output in outputs), outputs


def test_a_rank_0_that_fails_alone_is_named_on_every_rank() -> None:
    from tests.helpers.gloo_ranks import run_ranks

    outputs = run_ranks(2, ["-c", SCRIPT, "fail"], expect=1)
    assert all("waited 1200 s for 2 inference servers to register" in output for output in outputs), outputs
    assert "trainer rank 0 failed: StepError" in outputs[1]
