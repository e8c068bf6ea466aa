"""Each engine's own python and environment (`sglang.python`, `sglang.env_vars`, `vllm.*`; rlkit.servers.engine_env):
what the serve step starts, and the submit-time checks. A job may serve its policy with SGLang from one venv and an
auxiliary model with vLLM from another (tests/integration/test_auxiliary_e2e.py runs that on the dev cluster)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import FatalStepError
from rlkit.jobs.validate import validate
from rlkit.servers.auth import TOKEN_ENV
from rlkit.servers.backend import backend_for
from rlkit.steps.serve import launch_env, server_launch

TOKEN = "0123abcd" * 4


def launched(config: ExperimentConfig, backend: str, secret_dir: Path) -> tuple[list[str], dict[str, str]]:
    launch = server_launch(config, backend_for(backend), 1, 8000, token=TOKEN, secret_dir=secret_dir, index=0)
    return launch.argv, launch_env(launch)


def test_the_engine_runs_with_its_sections_python_and_environment(grpo_yaml: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/rlkit/checkout")
    monkeypatch.setenv("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")  # inherited, and still removed by SGLang's launch
    python = tmp_path / "sglang-venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    config = load_config(grpo_yaml, ["allocation_mode=sglang:d1+fsdp:d2", f"sglang.python={python}",
                                     "sglang.env_vars='SGLANG_USE_CPU_ENGINE=1,PYTHONPATH=/shim'",
                                     "vllm.env_vars=ONLY_VLLM=1"])
    argv, env = launched(config, "sglang", tmp_path)
    assert argv[:3] == [str(python), "-m", "sglang.launch_server"]
    assert env["SGLANG_USE_CPU_ENGINE"] == "1" and env["PYTHONPATH"] == "/shim"  # the section's value, as written
    assert "SGLANG_RETURN_ORIGINAL_LOGPROB" not in env and "ONLY_VLLM" not in env
    # the vLLM section's settings reach vLLM servers only; its python stays the serve step's when not set
    argv, env = launched(config, "vllm", tmp_path)
    assert argv[0] == sys.executable and env["ONLY_VLLM"] == "1" and env["PYTHONPATH"] == "/rlkit/checkout"
    assert "SGLANG_USE_CPU_ENGINE" not in env and env[TOKEN_ENV] == TOKEN


def test_a_python_the_node_cannot_run_stops_the_step_before_anything_starts(grpo_yaml: Path, tmp_path: Path) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    for python in (str(tmp_path / "no-venv" / "bin" / "python"), "no-such-python-3.99"):
        config = load_config(grpo_yaml, ["allocation_mode=sglang:d1+fsdp:d2", f"sglang.python={python}"])
        with pytest.raises(FatalStepError, match=f"sglang.python '{python}' cannot be run on this node"):
            launched(config, "sglang", secrets)
    assert not list(secrets.iterdir())  # no key file written


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
@pytest.mark.parametrize("lora", [False, True])
def test_launch_env_names_cover_what_each_launch_sets_or_removes(backend: str, lora: bool, tmp_path: Path) -> None:
    """The names `<backend>.env_vars` may not use are exactly the ones the launch would override."""
    engine = backend_for(backend)
    config = ExperimentConfig(allocation_mode=f"{backend}:d1+fsdp:d1")
    config.actor.use_lora = lora
    config.actor.target_modules = ["q_proj"]
    launch = engine.launch(config, python="p", model="/m", host="h", port=1, tp=1, token=TOKEN, secret_dir=tmp_path,
                           index=0)
    assert set(launch.env) | set(launch.unset_env) <= set(engine.launch_env_names)


def problems(grpo_yaml: Path, *overrides: str) -> list[str]:
    return [str(e) for e in validate(load_config(grpo_yaml, list(overrides))).problems.errors]


def test_sound_sections_pass(grpo_yaml: Path) -> None:
    assert problems(grpo_yaml, "allocation_mode=sglang:d1+fsdp:d2", f"sglang.python={sys.executable}",
                    "sglang.env_vars=A=1,B=x/y") == []
    assert problems(grpo_yaml, "vllm.python=python3", "vllm.env_vars=A=1") == []  # a name: looked up on the node


def test_each_mistake_is_named_with_its_fix(grpo_yaml: Path, tmp_path: Path) -> None:
    found = problems(grpo_yaml, "allocation_mode=sglang:d1+fsdp:d2", f"sglang.python={tmp_path}/none/bin/python",
                     "sglang.env_vars='SGLANG_RETURN_ORIGINAL_LOGPROB=1,oops'")
    assert any("sglang.env_vars: 'oops' is not NAME=VALUE" in p for p in found), found
    assert any(f"sglang.python: '{tmp_path}/none/bin/python' is not an executable file" in p for p in found), found
    found = problems(grpo_yaml, "allocation_mode=sglang:d1+fsdp:d2", "sglang.env_vars=SGLANG_RETURN_ORIGINAL_LOGPROB=1")
    assert found == ["sglang.env_vars: SGLANG_RETURN_ORIGINAL_LOGPROB is set by rlkit itself for sglang servers\n"
                     "  fix: remove SGLANG_RETURN_ORIGINAL_LOGPROB from sglang.env_vars"]
    # an auxiliary model on the other engine: its section is checked too
    judge = grpo_yaml.parent / "model"
    found = problems(grpo_yaml, "allocation_mode=sglang:d1+fsdp:d2", "cluster.n_nodes=4",
                     f"auxiliary_models=[{{name: judge, model_path: {judge}}}]", f"vllm.env_vars={TOKEN_ENV}=x")
    assert any(f"vllm.env_vars: {TOKEN_ENV} is set by rlkit itself" in p for p in found), found


def test_a_missing_python_is_a_site_problem_and_not_checked_for_images(grpo_yaml: Path) -> None:
    """The login node may not see a compute node's files: a site problem (`rlkit render` warns); inside an image the
    path is not the login node's to check."""
    missing = "/nowhere/bin/python"
    assert not os.path.exists(missing)
    errors = validate(load_config(grpo_yaml, [f"vllm.python={missing}"])).problems.errors
    assert [e.site for e in errors if "vllm.python" in str(e)] == [True]
    errors = validate(load_config(grpo_yaml, [f"vllm.python={missing}", "launcher.slurm.container_type=apptainer",
                                              "launcher.slurm.trainer_image=/i/t.sif",
                                              "launcher.slurm.inference_server_image=/i/s.sif"])).problems.errors
    assert not [e for e in errors if "vllm.python" in str(e)]
