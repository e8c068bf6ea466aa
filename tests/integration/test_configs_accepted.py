"""Every example config parses, validates, and renders a script the real controller accepts (sbatch --test-only).

Paths that exist only on a GPU site (images, models, data under /storage) are pointed at stand-in files here: empty
`.sif` files and a directory holding only config.json and tokenizer.json (a reward model's says what a sequence
classifier's says). Apptainer itself cannot run on this
machine; the controller judges the rendered job (nodes, GPUs, CPUs, memory per component of a heterogeneous job, or
of the one allocation whose steps share nodes: configs/grpo-one-node*.yaml).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.conftest import CONFIGS, example_configs, run_rlkit

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig

# the dev cluster's controller (sbatch --test-only; no job runs)
pytestmark = [pytest.mark.slurm, pytest.mark.controller]

EXAMPLES = sorted(CONFIGS.glob("*.yaml"))


@functools.cache
def _loaded(example: Path) -> tuple[ExperimentConfig, ...]:
    """The configs an example submits (tests.conftest.example_configs), loaded once for the module: its tests only
    read them, and each loaded every example again (~5 CPU-s a test)."""
    return tuple(example_configs(example))


@pytest.fixture
def site_standins(tmp_path: Path) -> list[str]:
    """Overrides pointing a GPU site's paths at stand-ins on this machine."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "tokenizer.json").write_text("{}")
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"prompt": "1+1=", "problem": "1+1=", "answer": "2", "response": " 2",
                                "chosen": " 2", "rejected": " b",  # the pair job types' columns
                                "task": 0,  # workflow verifiers: the task's index in the taskset
                                "messages": [{"role": "user", "content": "1+1="},
                                             {"role": "assistant", "content": "2"}]}) + "\n")
    reward_model = tmp_path / "reward-model"  # a sequence classifier trained elsewhere (configs/grpo-reward-model.yaml)
    reward_model.mkdir()
    (reward_model / "config.json").write_text(json.dumps({"architectures": ["LlamaForSequenceClassification"],
                                                          "num_labels": 1, "max_position_embeddings": 131072}))
    (reward_model / "tokenizer.json").write_text("{}")
    images = []
    for role in ("inference_server_image", "trainer_image"):
        image = tmp_path / f"{role}.sif"
        image.write_bytes(b"stand-in, never executed")
        images.append(f"launcher.slurm.{role}={image}")
    return [f"actor.path={model}", f"generate.dataset.path={data}", f"train_dataset.path={data}",
            f"cluster.fileroot={tmp_path}/root", f"reward.reward_model_path={reward_model}", *images]


def _for(config: Path, standins: list[str]) -> list[str]:
    """The stand-ins a config takes: no images for a CPU example (container_type none refuses them as ignored), no
    dataset file where the rows are generated in the job (train_dataset.path reasoning-gym), and only the datasets
    its job types read (a section no stage reads is refused as ignored: rlkit.checks.unread_knobs)."""
    from rlkit.config.schema.reasoning_gym import names_reasoning_gym
    from rlkit.jobs import job_type_for

    example = _loaded(config)[0]
    if names_reasoning_gym(example.train_dataset.path):
        standins = [o for o in standins if not o.startswith("train_dataset.path=")]
    read = {section for c in _loaded(config) for section in job_type_for(c.type).sections}
    standins = [o for o in standins if o.split(".", 1)[0] not in ("generate", "train_dataset")
                or o.split(".", 1)[0] in read]
    if not example.reward.reward_model_path.startswith("/storage/"):  # a GPU site's reward model only
        standins = [o for o in standins if not o.startswith("reward.reward_model_path=")]
    if example.launcher.slurm.container_type == "apptainer":
        return standins
    return [o for o in standins if not o.startswith(("launcher.slurm.trainer_image=",
                                                     "launcher.slurm.inference_server_image="))]


def test_there_are_gpu_and_cpu_examples() -> None:
    kinds = {c.launcher.slurm.container_type for path in EXAMPLES for c in _loaded(path)}
    assert kinds == {"apptainer", "none"}
    assert (CONFIGS / "grpo.yaml") in EXAMPLES


def test_cpu_examples_start_servers_eager_gpu_examples_compiled() -> None:
    """CPU servers skip torch.compile's warm-up (half the start time, bench/bench_vllm_start.py) and keep their
    worker in the engine process (no busy-polling second process); GPU servers keep vLLM's defaults."""
    from rlkit.jobs import job_type_for
    from rlkit.servers.backend import backend_for
    from rlkit.steps.serve import server_launch

    for path, config in ((example, c) for example in EXAMPLES for c in _loaded(example)):
        if not job_type_for(config.type).needs_servers:
            continue  # a trainer-only example (sft) starts no server
        argv = server_launch(config, backend_for("vllm"), 1, 8000, token="t", secret_dir=Path("/nonexistent"),
                             index=0).argv
        on_cpu = config.launcher.slurm.container_type == "none"
        assert ("--enforce-eager" in argv, "--no-enforce-eager" in argv) == (on_cpu, not on_cpu), path.name
        env = config.launcher.inference_server_env_vars.split(",")
        one_process = "VLLM_ENABLE_V1_MULTIPROCESSING=0" in env
        forked = "VLLM_WORKER_MULTIPROC_METHOD=fork" in env  # the engine process forked, not spawned (plugin.py)
        assert one_process == forked == on_cpu, path.name


@pytest.mark.slurm
@pytest.mark.parametrize("config", EXAMPLES, ids=lambda p: p.stem)
def test_controller_accepts_rendered_script(config: Path, site_standins: list[str], rlkit_home: Path) -> None:
    data = next(o for o in site_standins if o.startswith("train_dataset.path=")).partition("=")[2]
    held_out = _held_out(config, data)  # sft/rw/dpo demos
    result = run_rlkit("render", str(config), *_for(config, site_standins), *held_out, "--test-only")
    assert result.returncode == 0, result.stderr
    assert "to start at" in result.stderr  # the controller's own verdict
    if _loaded(config)[0].launcher.slurm.container_type == "apptainer":
        assert "apptainer exec --pwd / --nv --bind" in result.stdout
    assert not rlkit_home.exists()


@pytest.mark.slurm
def test_controller_verdict_is_real(site_standins: list[str], rlkit_home: Path) -> None:
    """The same check refuses a layout the cluster cannot hold (5 server nodes on a 4-node cluster)."""
    example = CONFIGS / "generate-gpu.yaml"
    result = run_rlkit("render", str(example), *_for(example, site_standins), "allocation_mode=vllm:d40",
                       "cluster.n_nodes=6", "--test-only")
    assert result.returncode == 2
    assert "Slurm rejects this job" in result.stderr


@pytest.mark.slurm
def test_controller_accepts_a_trainer_only_job(site_standins: list[str], rlkit_home: Path) -> None:
    """A job of one component (sft: fsdp:d2, no servers) is a plain, not heterogeneous, job the controller takes."""
    data = next(o for o in site_standins if o.startswith("train_dataset.path=")).partition("=")[2]
    demo = CONFIGS / "sft-cpu-demo.yaml"
    result = run_rlkit("render", str(demo), *_for(demo, site_standins), f"valid_dataset.path={data}", "--test-only")
    assert result.returncode == 0, result.stderr
    assert "to start at" in result.stderr and "using 2 processors" in result.stderr
    assert "#SBATCH hetjob" not in result.stdout and "--het-group" not in result.stdout
    assert not rlkit_home.exists()


@pytest.mark.slurm
def test_controller_accepts_a_three_component_job(site_standins: list[str], rlkit_home: Path) -> None:
    """Two server groups and a trainer (the CPU GRPO demo with one policy server and an auxiliary judge): three
    heterogeneous components the controller takes, and the node check of step 0 runs on all three."""
    model = next(o for o in site_standins if o.startswith("actor.path=")).partition("=")[2]
    demo = CONFIGS / "grpo-cpu-demo.yaml"
    result = run_rlkit("render", str(demo), *_for(demo, site_standins), "allocation_mode=vllm:d1+fsdp:d2",
                       f"auxiliary_models=[{{name: judge, model_path: {model}}}]", "--test-only")
    assert result.returncode == 0, result.stderr
    assert "to start at" in result.stderr  # the controller's own verdict
    assert result.stdout.count("#SBATCH hetjob") == 2
    assert "NODE_CHECKS=(node_check_0 node_check_1 node_check_2)" in result.stdout  # step 0 on each component
    assert "--auxiliary judge" in result.stdout
    assert not rlkit_home.exists()


@pytest.mark.slurm
def test_controller_accepts_a_packed_job_on_two_nodes(site_standins: list[str], rlkit_home: Path) -> None:
    """12 server GPUs + 4 trainer GPUs on nodes of 8: one allocation of 2 nodes (the trainer and 4 servers on the
    first, 8 servers on the second), each step on its slice; the controller takes it."""
    data = next(o for o in site_standins if o.startswith("train_dataset.path=")).partition("=")[2]
    example = CONFIGS / "grpo.yaml"
    result = run_rlkit("render", str(example), *_for(example, site_standins), f"valid_dataset.path={data}",
                       "allocation_mode=vllm:d12+fsdp:d4", "--test-only")
    assert result.returncode == 0, result.stderr
    assert "to start at" in result.stderr  # the controller's own verdict
    assert "# placement: packed, one allocation of 2 node(s)" in result.stdout
    assert "#SBATCH --nodes=2\n" in result.stdout and "#SBATCH hetjob" not in result.stdout
    assert result.stdout.count("--relative=1 --gres=gpu:1 ") == 2 * 8  # 8 servers and their node checks on node 1
    assert not rlkit_home.exists()


def _held_out(example: Path, data: str) -> list[str]:
    """The override pointing the example's validation set at the stand-in data (only the stages that have one)."""
    from rlkit.config.problems import Problems
    from rlkit.launch.stages import compose_stages, has_stages

    if not has_stages(example):
        return [f"valid_dataset.path={data}"] if _loaded(example)[0].valid_dataset.path else []
    return [f"stages.{stage.name}.valid_dataset.path={data}" for stage in compose_stages(example, [], Problems())
            if stage.config is not None and stage.config.valid_dataset.path]
