"""The SGLang backend's config side (no server): the launch keeps the token off argv and the environment, and refuses
extra_args that would undo rlkit's setup (tests/unit/test_layering.py checks that loading it imports no torch)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlkit.config.schema.experiment import ExperimentConfig, SGLangConfig
from rlkit.errors import FatalStepError
from rlkit.servers.backend import backend_for
from rlkit.servers.sglang.backend import BACKEND

TOKEN = "tok-3f9a-secret"


def config(**sglang: object) -> ExperimentConfig:
    return ExperimentConfig(experiment_name="e", trial_name="t", allocation_mode="sglang:d1",
                            sglang=SGLangConfig(**sglang))  # type: ignore[arg-type]


def test_launch_puts_the_token_in_a_0600_config_file_only(tmp_path: Path) -> None:
    launch = BACKEND.launch(config(dtype="float32", extra_args={"device": "cpu", "max_total_tokens": 4096}),
                            python="/venv/bin/python", model="/m", host="0.0.0.0", port=8123, tp=2, token=TOKEN,
                            secret_dir=tmp_path, index=3)
    key_file = tmp_path / "sglang-3.yaml"
    assert key_file.stat().st_mode & 0o777 == 0o600
    assert key_file.read_text() == f'api-key: "{TOKEN}"\n'
    assert not any(TOKEN in arg for arg in launch.argv)
    assert not any(TOKEN in value for value in launch.env.values())
    argv = launch.argv
    assert argv[:3] == ["/venv/bin/python", "-m", "sglang.launch_server"]
    assert argv[argv.index("--config") + 1] == str(key_file)
    for flag, value in [("--model-path", "/m"), ("--port", "8123"), ("--tp-size", "2"), ("--dtype", "float32"),
                        ("--random-seed", "1"), ("--device", "cpu"), ("--max-total-tokens", "4096")]:
        assert argv[argv.index(flag) + 1] == value
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" in launch.unset_env  # completion log-probs keep the temperature


def test_launch_refuses_extra_args_that_undo_rlkits_setup(tmp_path: Path) -> None:
    with pytest.raises(FatalStepError) as refused:
        BACKEND.launch(config(extra_args={"api_key": "x", "port": 1, "dtype": "float16"}), python="p", model="/m",
                       host="h", port=1, tp=1, token=TOKEN, secret_dir=tmp_path, index=0)
    message = str(refused.value)
    assert "sglang.extra_args.api_key" in message and "sglang.extra_args.port" in message
    assert "set sglang.dtype instead" in message
    assert not list(tmp_path.iterdir())  # nothing written before the refusal


def test_config_fields() -> None:
    assert BACKEND.configured_model(config()) is None
    assert BACKEND.configured_model(config(model_path="/x")) == "/x"
    assert BACKEND.context_length(config(context_length=2048)) == 2048
    assert (BACKEND.model_field, BACKEND.context_field, BACKEND.guard_probe) == (
        "sglang.model_path", "sglang.context_length", "/v1/models")



def test_the_registry_finds_the_backend() -> None:
    assert backend_for("sglang") is BACKEND and BACKEND.name == "sglang"
