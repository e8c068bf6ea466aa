"""Bare-host steps run the interpreter `rlkit submit` runs under when launcher.python is empty
(rlkit.checks.host_python): one without the packages a step imports is a site problem, warned at render and refused
at submit, naming each package and the step that needs it. The login-node install (scripts/install.sh) meets it for
real in tests/integration/test_login_install.py; here find_spec is made to miss packages of this full venv."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.checks import host_python
from rlkit.errors import ConfigError
from rlkit.launch.submit import prepare


@pytest.fixture
def lacking(monkeypatch: pytest.MonkeyPatch) -> set[str]:
    """The top-level packages this interpreter is made to lack."""
    gone: set[str] = set()
    real = host_python.find_spec
    monkeypatch.setattr(host_python, "find_spec", lambda name: None if name in gone else real(name))
    return gone


def _messages(path: Path, *overrides: str) -> list[str]:
    """The check's warnings for the config with launcher.python empty (the fixtures name one) and these overrides."""
    prepared = prepare(path, ["launcher.python=", *overrides], dry_run=True)
    return [w.message for w in prepared.warnings if "launcher.python" in w.message]


def test_a_trainer_without_torch_is_named_with_the_fix(grpo_yaml: Path, lacking: set[str]) -> None:
    lacking.update({"torch", "vllm"})
    [message] = _messages(grpo_yaml)
    assert "torch (the trainer)" in message and "vllm (the vllm servers: vllm.python is empty)" in message
    assert "transformers" not in message  # this venv has it
    with pytest.raises(ConfigError) as refused:
        prepare(grpo_yaml, ["launcher.python="], dry_run=False)
    assert "torch (the trainer)" in str(refused.value) and "set launcher.python" in refused.value.hint


def test_a_named_python_an_engine_s_own_or_an_image_is_not_this_interpreter(grpo_yaml: Path,
                                                                            lacking: set[str]) -> None:
    lacking.update({"torch", "transformers", "vllm"})
    assert _messages(grpo_yaml, "launcher.python=python3") == []
    [message] = _messages(grpo_yaml, "vllm.python=/usr/bin/python3")
    assert "vllm" not in message.split("which has no", 1)[1] and "torch (the trainer)" in message


def test_the_generate_client_needs_transformers_only(generate_yaml: Path, lacking: set[str]) -> None:
    lacking.update({"torch", "transformers"})
    [message] = _messages(generate_yaml)
    assert message.endswith("which has no transformers (the client step)")


def test_a_complete_interpreter_passes(grpo_yaml: Path, generate_yaml: Path) -> None:
    assert _messages(grpo_yaml) == [] and _messages(generate_yaml) == []
