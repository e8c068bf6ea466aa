"""The programs an agent workflow starts on the trainer's node are checked at submit where the login node sees them
(rlkit.checks.agent_programs): the verifiers venv's python and an agent command's program by absolute path. A path
that exists here must be executable, one under the home directory or the fileroot must exist (site problems: submit
refuses, render warns); one elsewhere that is not here may be node-local and is left to the job."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.errors import ConfigError
from rlkit.jobs.validate import validate

FIELDS = ("the verifiers venv's python", "rollout.agent.verifiers.python", "$RLKIT_VERIFIERS_PYTHON",
          "rollout.agent.openai.command[0]")
VERIFIERS = ("rollout.agent.workflow=verifiers", "rollout.agent.verifiers.environment=my_taskset")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("RLKIT_VERIFIERS_PYTHON", raising=False)
    return home


def _programs(grpo_yaml: Path, *overrides: str) -> list[ConfigError]:
    """The problems naming an agent program (the other problems of these configs are not this check's)."""
    errors = validate(load_config(grpo_yaml, list(overrides))).problems.errors
    return [e for e in errors if e.message.startswith(FIELDS)]


def _executable(path: Path, mode: int = 0o755) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(mode)
    return path


def test_the_verifiers_python_is_checked_where_the_login_node_sees_it(grpo_yaml: Path, home: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    missing = _programs(grpo_yaml, *VERIFIERS)  # the default venv, in the submitting user's home, never built
    assert [e.message for e in missing] == [
        f"the verifiers venv's python (rollout.agent.verifiers.python empty): '{home}/.cache/rlkit-verifiers/venv/"
        "bin/python' does not exist (the shared filesystem, seen from here as from the nodes)"]
    assert missing[0].site and "bash scripts/verifiers-env.sh" in str(missing[0].hint)  # render: a warning
    assert _programs(grpo_yaml, *VERIFIERS, f"rollout.agent.verifiers.python={_executable(home / 'py')}") == []
    plain = _executable(home / "plain", 0o644)
    assert [e.message for e in _programs(grpo_yaml, *VERIFIERS, f"rollout.agent.verifiers.python={plain}")] == [
        f"rollout.agent.verifiers.python: '{plain}' is not an executable file"]
    assert _programs(grpo_yaml, *VERIFIERS, "rollout.agent.verifiers.python=/node-local/venv/bin/python") == []
    monkeypatch.setenv("RLKIT_VERIFIERS_PYTHON", str(home / "other" / "python"))
    assert "$RLKIT_VERIFIERS_PYTHON: '" in str(_programs(grpo_yaml, *VERIFIERS)[0])
    _executable(home / ".cache/rlkit-verifiers/venv/bin/python")
    monkeypatch.delenv("RLKIT_VERIFIERS_PYTHON")
    assert _programs(grpo_yaml, *VERIFIERS) == []  # built: nothing to say


def test_an_agent_commands_program_by_absolute_path_is_checked_alike(grpo_yaml: Path, home: Path) -> None:
    def command(*words: str) -> list[str]:
        return [e.message for e in _programs(grpo_yaml, "rollout.agent.workflow=openai",
                                          f"rollout.agent.openai.command=[{', '.join(words)}]")]

    assert command(str(home / "agent.sh")) == [f"rollout.agent.openai.command[0]: '{home}/agent.sh' does not exist "
                                               "(the shared filesystem, seen from here as from the nodes)"]
    assert command(str(_executable(home / "agent.sh", 0o644))) == [
        f"rollout.agent.openai.command[0]: '{home}/agent.sh' is not an executable file"]
    assert command(str(_executable(home / "agent.sh"))) == []
    assert command("python3", str(home / "agent.py")) == []  # a name: the node's PATH
    assert command("/node-local/bin/agent") == []  # not here, not on the shared filesystem: left to the job
