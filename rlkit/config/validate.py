"""Semantic checks of a loaded ExperimentConfig, run before anything touches disk or Slurm.

Each check raises ConfigError naming the field, the problem and the fix. The GPU layout itself is checked by the
planner (rlkit.launch.plan), which is the one place that knows how GPUs become nodes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from rlkit.config.schema import CONTAINER_TYPES, JOB_TYPES, NAME_RESOLVE_TYPES, ExperimentConfig
from rlkit.config.slurm_time import slurm_time_seconds
from rlkit.errors import ConfigError

_EXPERIMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*$")
_TRIAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._]*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_IMAGE_URI = ("docker://", "docker-archive://", "oras://", "library://", "shub://", "http://", "https://")
_SAFE_PATH = re.compile(r"^[A-Za-z0-9._+@/=,:-]+$")
DATASET_SUFFIXES = (".jsonl", ".json", ".parquet")


def check_name(field: str, value: str, pattern: re.Pattern[str], forbidden: str) -> None:
    """Experiment and trial names become directory names and Slurm job names."""
    if not pattern.fullmatch(value):
        raise ConfigError(
            f"{field} '{value}' is not allowed: use letters, digits and '.', without {forbidden}, '/' or spaces",
            hint=f"e.g. {field}={'math-grpo' if field == 'experiment_name' else 'run_1'}",
        )


def parse_env_vars(field: str, text: str) -> dict[str, str]:
    """'A=1,B=2' -> {'A': '1', 'B': '2'}; raises ConfigError on a malformed item."""
    env: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        if not sep or not _ENV_NAME.fullmatch(name):
            raise ConfigError(f"{field}: '{item}' is not NAME=VALUE", hint=f"e.g. {field}='NCCL_DEBUG=WARN,A=1'")
        env[name] = value
    return env


def parse_mounts(text: str) -> list[str]:
    """'src:dst,src2:dst2' -> ['src:dst', ...]; both sides absolute paths."""
    mounts: list[str] = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        parts = item.split(":")
        if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]):
            raise ConfigError(
                f"launcher.slurm.mount: '{item}' is not /host/path:/container/path[:ro]",
                hint="e.g. launcher.slurm.mount=/storage:/storage,/scratch:/scratch",
            )
        mounts.append(item)
    return mounts


def is_image_uri(image: str) -> bool:
    """An image Apptainer fetches itself (not a local file we can check)."""
    return image.startswith(_IMAGE_URI)


def _check_image(field: str, image: str) -> None:
    if not image:
        raise ConfigError(f"{field} is empty but launcher.slurm.container_type is apptainer",
                          hint=f"set {field}=/path/to/image.sif, or launcher.slurm.container_type=none")
    if not is_image_uri(image) and not Path(image).is_file():
        raise ConfigError(f"{field}: image file '{image}' does not exist",
                          hint="build it from containers/ (apptainer build) or point to an existing .sif")


def check_model_dir(field: str, value: str) -> None:
    """A local model path (absolute or relative) must be a Hugging Face model directory; hub ids are not checked."""
    if value.startswith(("/", ".")) and not (Path(value) / "config.json").is_file():
        raise ConfigError(f"{field}: '{value}' is not a model directory (no config.json)",
                          hint="point to a Hugging Face model directory on the shared filesystem")


def check_dataset_file(field: str, value: str) -> None:
    """A dataset must be a local .jsonl/.json/.parquet file or a directory of them."""
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"{field}: '{value}' does not exist", hint="give the path of a .jsonl or .parquet file")
    if path.is_file() and path.suffix not in DATASET_SUFFIXES:
        raise ConfigError(f"{field}: '{value}' is not a .jsonl or .parquet file")


def server_model(config: ExperimentConfig, backend: str) -> str:
    """The model the inference servers load (the backend's own field, else actor.path)."""
    own = config.vllm.model if backend == "vllm" else config.sglang.model_path
    return own or config.actor.path


def validate(config: ExperimentConfig) -> None:
    """Check everything that can be checked without Slurm; raise ConfigError on the first problem."""
    check_name("experiment_name", config.experiment_name, _EXPERIMENT, "'_'")
    check_name("trial_name", config.trial_name, _TRIAL, "'-'")
    if config.type not in JOB_TYPES:
        raise ConfigError(f"type '{config.type}' is not a job type", hint=f"choose one of: {', '.join(JOB_TYPES)}")
    cluster = config.cluster
    if not cluster.fileroot.startswith("/"):
        raise ConfigError(f"cluster.fileroot '{cluster.fileroot}' must be an absolute path on the shared filesystem")
    if not _SAFE_PATH.fullmatch(cluster.fileroot):
        raise ConfigError(f"cluster.fileroot {cluster.fileroot!r} has characters Slurm's #SBATCH lines and file "
                          "patterns cannot carry (spaces, quotes, '%', '$', ';', '\\' or newlines)",
                          hint="use a path of letters, digits and . _ - + / @ only")
    if cluster.n_nodes < 1 or cluster.n_gpus_per_node < 1:
        raise ConfigError("cluster.n_nodes and cluster.n_gpus_per_node must be at least 1")
    if cluster.name_resolve.type not in NAME_RESOLVE_TYPES:
        raise ConfigError(f"cluster.name_resolve.type '{cluster.name_resolve.type}' is not supported",
                          hint=f"choose one of: {', '.join(NAME_RESOLVE_TYPES)}")
    if cluster.name_resolve.nfs_record_root and not cluster.name_resolve.nfs_record_root.startswith("/"):
        raise ConfigError("cluster.name_resolve.nfs_record_root must be an absolute path on the shared filesystem")
    launcher = config.launcher
    for name in ("inference_server_cpus_per_gpu", "inference_server_mem_per_gpu", "trainer_cpus_per_gpu",
                 "trainer_mem_per_gpu", "client_cpus", "client_mem"):
        if getattr(launcher, name) < 1:
            raise ConfigError(f"launcher.{name} must be at least 1 (got {getattr(launcher, name)})")
    parse_env_vars("launcher.inference_server_env_vars", launcher.inference_server_env_vars)
    parse_env_vars("launcher.trainer_env_vars", launcher.trainer_env_vars)
    slurm = launcher.slurm
    if slurm.time:
        try:
            seconds = slurm_time_seconds(slurm.time)
        except ValueError as exc:
            raise ConfigError(f"launcher.slurm.time {exc}",
                              hint="use minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], e.g. 2-00:00:00; "
                                   "quoting is not needed") from None
        warning = config.recover.time_limit_warning
        if config.type == "grpo" and config.recover.mode != "disabled" and seconds is not None and seconds <= warning:
            raise ConfigError(f"launcher.slurm.time {slurm.time} is not longer than recover.time_limit_warning "
                              f"({warning} s): Slurm would warn the trainer before it starts",
                              hint="give the job more time or lower recover.time_limit_warning")
    for name in ("srun_additional_args", "sbatch_additional_args", "apptainer_args"):
        try:
            shlex.split(getattr(slurm, name))
        except ValueError as exc:
            raise ConfigError(f"launcher.slurm.{name} cannot be split into arguments: {exc}") from None
    if slurm.container_type not in CONTAINER_TYPES:
        raise ConfigError(f"launcher.slurm.container_type '{slurm.container_type}' is not supported",
                          hint=f"choose one of: {', '.join(CONTAINER_TYPES)}")
    parse_mounts(slurm.mount)
    if slurm.container_type == "apptainer":
        _check_image("launcher.slurm.inference_server_image", slurm.inference_server_image)
        _check_image("launcher.slurm.trainer_image", slurm.trainer_image)
    if config.rollout.max_concurrent_rollouts < 1:
        raise ConfigError("rollout.max_concurrent_rollouts must be at least 1")
    if config.gconfig.n_samples < 1 or config.gconfig.max_new_tokens < 1:
        raise ConfigError("gconfig.n_samples and gconfig.max_new_tokens must be at least 1")
    _validate_models(config)
    if config.type == "generate":
        _validate_generate(config)
    if config.type == "grpo":
        from rlkit.config.validate_training import validate_training

        validate_training(config)


def _validate_models(config: ExperimentConfig) -> None:
    """Local model directories the job will load must exist (hub ids are left to the servers)."""
    from rlkit.launch.allocation import parse_allocation

    alloc = parse_allocation(config.allocation_mode)
    if alloc.server is not None:
        own_field = "vllm.model" if alloc.server.backend == "vllm" else "sglang.model_path"
        model = server_model(config, alloc.server.backend)
        check_model_dir(own_field if model != config.actor.path else "actor.path", model)
    tok = config.tokenizer_path
    if tok.startswith(("/", ".")) and not any((Path(tok) / f).is_file() for f in ("tokenizer.json",
                                                                                   "tokenizer_config.json")):
        raise ConfigError(f"tokenizer_path: '{tok}' holds no tokenizer (tokenizer.json or tokenizer_config.json)",
                          hint="point to a Hugging Face tokenizer directory, or leave it empty to use the model's")


def _validate_generate(config: ExperimentConfig) -> None:
    dataset = config.generate.dataset.path
    if not dataset:
        raise ConfigError("generate.dataset.path is not set", hint="give a .jsonl or .parquet file of prompts")
    check_dataset_file("generate.dataset.path", dataset)
    if Path(config.generate.output_file).is_absolute() or ".." in Path(config.generate.output_file).parts:
        raise ConfigError("generate.output_file must be a relative path inside the trial directory")
