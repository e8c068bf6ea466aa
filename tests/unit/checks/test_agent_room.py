"""The submit-time refusal of an agent config whose episodes could not even start (rlkit.checks.agent_room): the
first prompts, rendered with the tiny model's own chat template and the tools' text, against the episode's limit."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.jobs.validate import validate
from tests.conftest import CONFIGS, run_rlkit

EXAMPLE = CONFIGS / "grpo-agent-cpu-demo.yaml"  # its episodes are an OpenAI-client program's


@pytest.fixture(scope="module")
def native(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The agent example with the same task as a workflow against rlkit's context: the episodes' first prompts are
    then rlkit's to render, which is what the check judges."""
    text = EXAMPLE.read_text()
    program = text[text.index("    workflow: openai"):text.index("    tool_call_parser:")]
    config = tmp_path_factory.mktemp("agent-room") / "grpo-agent-native.yaml"
    config.write_text(text.replace(program, "    workflow: rlkit.agent.press_door:episode\n"
                                            "    tools: [rlkit.agent.press_door:press]\n"))
    return config


@pytest.fixture
def demo_dir(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from rlkit.agent.press_door import write_held_out
    from rlkit.tasks.digits import write_dataset

    directory = tmp_path / "demo"
    directory.mkdir()
    (directory / "tiny-model").symlink_to(tiny_model_dir)
    write_dataset(directory / "digits.jsonl", count=16)
    write_held_out(directory / "press-held-out.jsonl")
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(directory))
    monkeypatch.setenv("RLKIT_FILEROOT", str(tmp_path / "fileroot"))
    return directory


def _room_problems(config: Path, *overrides: str) -> list[str]:
    return [str(e) for e in validate(load_config(config, list(overrides))).problems.errors
            if "no episode could start" in str(e)]


def test_an_agent_config_whose_first_prompts_leave_no_room_is_refused_at_submit(demo_dir: Path, tmp_path: Path,
                                                                                rlkit_home: Path, native: Path) -> None:
    result = run_rlkit("submit", str(native), "vllm.max_model_len=128", env={**os.environ})
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "no episode could start: the shortest of the first 16" in result.stderr, result.stderr
    assert "may hold 128 (the servers' context: vllm.max_model_len or sglang.context_length)" in result.stderr
    assert "fix: raise vllm.max_model_len" in result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists(), "nothing written"
    # the example as written (max_model_len 512) leaves room; an episode limit of its own is named as the setting
    assert _room_problems(native) == []
    [problem] = _room_problems(native, "rollout.agent.engine_max_tokens=100")
    assert "may hold 100 (rollout.agent.engine_max_tokens)" in problem


def test_the_openai_workflow_is_not_judged_by_the_rows_its_program_may_not_send(demo_dir: Path, native: Path) -> None:
    assert _room_problems(native, "vllm.max_model_len=128") != [], "the same limit refuses rlkit's own workflow"
    assert _room_problems(EXAMPLE, "vllm.max_model_len=128") == []
