"""Hostile values through every string field of the schema: refused naming the field, or carried literally.

The fields are listed from the schema, so a new field is covered without touching this file. For each field and
each weird value (spaces, both quotes, `;`, `$()`, backticks, `|`, `#`, `%`, unicode, a newline, ...), `rlkit`
either refuses the config (a ConfigError naming the field) or renders a script that real bash parses (`bash -n`),
whose every step argv reads back, word for word, as planned, and that never runs the marker command when executed
by bash with no programs on its PATH. `#SBATCH` values are read back from the real controller (a held job).
"""

from __future__ import annotations

import copy
import dataclasses
import re
import shlex
import shutil
import subprocess
import typing
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.schema.auxiliary import AuxiliaryModelConfig
from rlkit.config.schema.experiment import ExperimentConfig, set_field
from rlkit.errors import ConfigError
from rlkit.launch.render import step_command
from rlkit.launch.submit import Prepared, prepare_config
from tests.conftest import write_fake_model, write_grpo_yaml

# the dev cluster's controller (sbatch; no job runs)
pytestmark = [pytest.mark.slurm, pytest.mark.controller]

MARK = "PWNED"
BASH = shutil.which("bash") or "/bin/bash"  # by absolute path: the runs below have no PATH to search
WEIRD = [
    "two words", "it's", 'say "hi"', "a;b", "a|b", "a#b", "a&b", "%j%x", "back\\slash", "ünï©ødé ☃",
    f"$(echo {MARK} > marker)", f"`echo {MARK} > marker`", "new\nline", "tab\there", "nul\x00byte",
    "/tmp/two words", f"/tmp/$(echo {MARK} > marker)", "-leading-dash", "~/home-relative", "hetjob", "packjob",
]


def string_fields(cls: type = ExperimentConfig, prefix: str = "") -> list[tuple[str, str]]:
    """(dotted path, kind) of every str, list[str] and dict field of the schema; kind says how to set it."""
    found: list[tuple[str, str]] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path, hint = f"{prefix}{f.name}", hints[f.name]
        if dataclasses.is_dataclass(hint):
            found += string_fields(typing.cast(type, hint), f"{path}.")
        elif hint in (str, str | None):
            found.append((path, "str"))
        elif typing.get_origin(hint) is list and dataclasses.is_dataclass(typing.get_args(hint)[0]):
            found += string_fields(typing.get_args(hint)[0], f"{path}[0].")  # a list of sections: its first entry
        elif typing.get_origin(hint) is list:
            found.append((path, "list"))
        elif typing.get_origin(hint) is dict:
            found += [(path, "dict-key"), (path, "dict-value")]
    return found


FIELDS = string_fields()


def _with_value(base: ExperimentConfig, path: str, kind: str, value: str) -> ExperimentConfig:
    """A copy of `base` with one field set as the loader would set it (the loader's own typing is tested in
    test_yaml_and_time; here every value is already a string)."""
    config = copy.deepcopy(base)
    if path.startswith("auxiliary_models[0].") and not config.auxiliary_models:  # an entry to put the value in
        config.auxiliary_models = [AuxiliaryModelConfig(name="judge", model_path=config.actor.path)]
        config.cluster.n_nodes += 1
    set_field(config, path, {"str": value, "list": [value], "dict-key": {value: 1},
                             "dict-value": {"some_flag": value}}[kind])
    return config


def _prepared_or_error(base: ExperimentConfig, path: str, kind: str, value: str) -> Prepared | ConfigError:
    try:
        return prepare_config(_with_value(base, path, kind, value), dry_run=True)
    except ConfigError as exc:
        return exc


def _bash_words(command_lines: list[str]) -> list[list[str]]:
    """The words real bash makes of each rendered command line (assigned to $@, never run), in one bash."""
    program = "".join(f'set -- {line}\nprintf "%s\\0" "$@"\nprintf "\\1\\0"\n' for line in command_lines)
    out = subprocess.run([BASH, "-c", program], capture_output=True, check=True, env={"PATH": "/nonexistent"})
    words = out.stdout.decode().split("\0")[:-1]
    lines: list[list[str]] = [[]]
    for word in words:
        lines.append([]) if word == "\1" else lines[-1].append(word)
    return lines[:-1]


def _run_without_programs(script: str, workdir: Path) -> None:
    """Execute the script with bash and an empty PATH: every step fails at once, and nothing but bash builtins
    could write the marker."""
    path = workdir / "job.sbatch"
    path.write_text(script)
    subprocess.run([BASH, str(path)], cwd=workdir, env={"PATH": str(workdir / "no-programs")},
                   capture_output=True, timeout=60, check=False)


@pytest.fixture(scope="module")
def loaded_base_config(tmp_path_factory: pytest.TempPathFactory) -> ExperimentConfig:
    """A grpo job in Apptainer images with etcd over TLS, env vars and mounts: every field the planner can put into
    the script is in play (sbatch options, srun/apptainer arguments, binds, environment, step argv). Loaded once
    for the module (a load was ~30% of its CPU); tests get copies (`base_config`)."""
    root = tmp_path_factory.mktemp("weird-values")
    grpo_yaml = write_grpo_yaml(root, write_fake_model(root))
    pem = root / "etcd"
    pem.mkdir()
    for name in ("ca.pem", "client.pem", "client-key.pem"):
        (pem / name).write_text("not a real certificate")
        (pem / name).chmod(0o600)
    return load_config(grpo_yaml, [
        "launcher.slurm.container_type=apptainer", "launcher.slurm.trainer_image=docker://ghcr.io/x/trainer:1",
        "launcher.slurm.inference_server_image=docker://ghcr.io/x/server:1", "launcher.slurm.mount=/data:/data",
        "launcher.trainer_env_vars=A=1", "launcher.inference_server_env_vars=B=2",
        "launcher.slurm.srun_additional_args=--mpi=none", "launcher.slurm.sbatch_additional_args=--comment=base",
        "cluster.name_resolve.type=etcd3", "cluster.name_resolve.etcd3_addr=etcd01:2379",
        f"cluster.name_resolve.etcd3_cacert={pem / 'ca.pem'}", f"cluster.name_resolve.etcd3_cert={pem / 'client.pem'}",
        f"cluster.name_resolve.etcd3_key={pem / 'client-key.pem'}",
    ])


@pytest.fixture
def base_config(loaded_base_config: ExperimentConfig) -> ExperimentConfig:
    """The module's config, copied: a test may change it (test_sbatch_reads_weird_values_back_literally does)."""
    return copy.deepcopy(loaded_base_config)


def test_the_schema_lists_the_fields_that_reach_the_script() -> None:
    paths = {path for path, _ in FIELDS}
    assert {"launcher.slurm.partition", "launcher.slurm.sbatch_additional_args", "launcher.trainer_env_vars",
            "vllm.extra_args", "gconfig.stop", "actor.path", "cluster.fileroot", "trial_name"} <= paths
    assert len(paths) > 40


@pytest.mark.parametrize(("path", "kind"), FIELDS, ids=[f"{p}:{k}" for p, k in FIELDS])
def test_weird_value_is_refused_or_carried_literally(base_config: ExperimentConfig, tmp_path: Path, path: str,
                                                     kind: str) -> None:
    for value in WEIRD:
        result = _prepared_or_error(base_config, path, kind, value)
        if isinstance(result, ConfigError):
            named = path.rsplit(".", 1)[0] if kind.startswith("dict") else path
            assert named in str(result), f"{value!r} in {path}: the error does not name the field: {result}"
            continue
        if path != "gconfig.stop":  # stop strings only travel in request bodies (rlkit.config.strings)
            assert "\n" not in value and "\t" not in value and "\x00" not in value, f"{path} accepted {value!r}"
        script = result.script
        syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True, check=False)
        assert syntax.returncode == 0, f"{value!r} in {path} broke the script: {syntax.stderr}"
        lines = script.splitlines()  # each step's command is the one line of its cmd_NAME() function
        rendered = [lines[i + 1].strip() for i, line in enumerate(lines) if re.fullmatch(r"cmd_\w+\(\) \{", line)]
        assert len(rendered) == len(result.plan.steps)
        planned = [list(step_command(step, result.plan)) for step in result.plan.steps]
        assert _bash_words(rendered) == planned, f"{value!r} in {path}"
        if MARK in value:
            workdir = tmp_path / "run"
            workdir.mkdir(exist_ok=True)
            _run_without_programs(script, workdir)
            assert not any(p.name == "marker" for p in tmp_path.rglob("marker")), f"{value!r} in {path} ran"


SBATCH_VALUES = [v for v in WEIRD if not any(c in v for c in "\n\t\x00")]


@pytest.mark.slurm
def test_sbatch_reads_weird_values_back_literally(base_config: ExperimentConfig, tmp_path: Path) -> None:
    """Each value as an sbatch option (`--comment`) and in the job name's neighbour fields, held, read back from
    the controller, cancelled: sbatch's own quoting carries it exactly."""
    base_config.experiment_name = "weird-values"
    for value in SBATCH_VALUES:
        result = _prepared_or_error(base_config, "launcher.slurm.sbatch_additional_args", "str",
                                    shlex.join([f"--comment={value}"]))
        assert isinstance(result, Prepared), result
        script = tmp_path / "held.sbatch"
        script.write_text(result.script)
        Path(result.plan.batch_log).parent.mkdir(parents=True, exist_ok=True)
        job = subprocess.run(["sbatch", "--hold", "--parsable", str(script)], capture_output=True, text=True,
                             check=True, cwd=tmp_path).stdout.strip().split(";")[0]
        try:
            shown = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,
                                   check=True).stdout
        finally:
            subprocess.run(["scancel", job], check=True)
        comments = [line.strip()[len("Comment="):] for line in shown.splitlines()
                    if line.strip().startswith("Comment=")]
        assert comments and comments[0].rstrip() == value, (value, shown)
        assert f"JobName=weird-values_{base_config.trial_name}" in shown
        assert "HetJobOffset=1" in shown and "HetJobOffset=2" not in shown, "the job keeps its two components"


def test_no_field_accepts_a_newline(base_config: ExperimentConfig, tmp_path: Path) -> None:
    """The central rule, on its own: every string field refuses a newline and names itself."""
    for path, kind in FIELDS:
        if path == "gconfig.stop":
            continue  # a stop string is often a newline; it only travels in request bodies
        result = _prepared_or_error(base_config, path, kind, "x\ny")
        assert isinstance(result, ConfigError), path
        assert "control characters" in str(result), (path, str(result))
    accepted = _prepared_or_error(base_config, "gconfig.stop", "list", "\n\n")
    assert isinstance(accepted, Prepared), accepted
