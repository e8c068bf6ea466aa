"""Semantic checks of a loaded ExperimentConfig, run before anything touches disk or Slurm.

Every check runs, and every problem is kept (rlkit.config.problems): the user sees all of them at once, each
naming its field and its fix. The GPU layout itself is checked by the planner (rlkit.launch.plan), the one place
that knows how GPUs become nodes; `rlkit.launch.submit.prepare` adds its problems to these.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.checks.agent import validate_agent
from rlkit.checks.auxiliary import validate_auxiliary
from rlkit.checks.binds import check_binds
from rlkit.checks.host_python import validate_host_python
from rlkit.checks.image_labels import check_image_labels
from rlkit.checks.layout import check_layout
from rlkit.checks.reference import validate_reference
from rlkit.checks.reward_model_servers import validate_reward_model_servers
from rlkit.checks.sampling import validate_greedy, validate_min_new_tokens, validate_stop
from rlkit.checks.sequence_parallel import validate_sequence_parallel
from rlkit.checks.site_files import (
    check_image,
    check_model_dir,
    check_tokenizer_dir,
    check_writable_root,
)
from rlkit.checks.unread_knobs import validate_unread_knobs
from rlkit.checks.weight_delta import validate_weight_delta
from rlkit.config.allocation import Allocation, parse_allocation
from rlkit.config.model_config import model_positions
from rlkit.config.names import check_name
from rlkit.config.problems import Problems, refuse_inert_fields
from rlkit.config.ranges import check_ranges
from rlkit.config.schema.evaluation import evaluation_enabled
from rlkit.config.schema.experiment import (
    CONTAINER_TYPES,
    NAME_RESOLVE_TYPES,
    ExperimentConfig,
    SlurmConfig,
    get_field,
)
from rlkit.config.strings import check_strings
from rlkit.servers.backend import backend_for, server_model, servers_context
from rlkit.servers.engine_env import check_engine_env, parse_env_vars
from rlkit.slurm.time_limits import slurm_time_seconds
from rlkit.trials.paths import TrialPaths

if TYPE_CHECKING:
    from rlkit.jobs.base import JobType
    from rlkit.jobs.job_types import JobTypes

# Experiment and trial names: what Slurm job names, directory names and `experiment/trial` arguments all carry
# unquoted ('_' and '-' both, as AReaL's files use them)
_SAFE_PATH = re.compile(r"[A-Za-z0-9._+@/=-]+")  # also no , or : (apptainer bind separators)
# Options rlkit sets on every step itself: a user's copy would undo the safe working directory.
_RLKIT_SETS = {"srun_additional_args": ("--chdir", "-D"), "apptainer_args": ("--pwd",),
               "sbatch_additional_args": ("--job-name", "-J", "--output", "-o")}
_WHY_RLKIT_SETS = {  # what the option rlkit sets itself is for
    "sbatch_additional_args": "rlkit stop, resume and submit --force know the trial's job by its name and batch "
                              "log, since Slurm reuses job ids"}
_WHY_DIRECTORY = "steps run from a directory nobody else can write, so nothing is imported from the trial directory"


@dataclass(frozen=True)
class Validated:
    """A config with every problem found in it, and its allocation when that parsed into the components its job
    type has (the planner's input; None: there is nothing to plan)."""

    config: ExperimentConfig
    allocation: Allocation | None
    problems: Problems


def _validate_epoch_evaluation(config: ExperimentConfig, job: JobType, problems: Problems) -> None:
    """Job types that evaluate valid_dataset at each epoch's end (sft, rw, dpo) accept the evaluator saying just that
    (AReaL's configs for them do: freq_epochs 1); other frequencies would be ignored and are refused."""
    ev = config.evaluator
    every_epoch = ev.freq_epochs == 1 and not ev.freq_steps and not ev.freq_secs
    if every_epoch:
        if not config.valid_dataset.path:
            problems.add(f"evaluator.freq_epochs is 1, but valid_dataset.path is not set: job type {job.name} "
                         "evaluates on the validation set at each epoch's end", hint="set valid_dataset.path, or "
                                                                                     "remove the evaluator section")
        return
    problems.add(f"job type {job.name} evaluates valid_dataset at each epoch's end; other evaluator "
                 "frequencies are not supported yet", hint="set evaluator.freq_epochs=1 (and freq_steps, "
                                                          "freq_secs null), or remove the evaluator section")


def check_experiment(config: ExperimentConfig, job_types: JobTypes) -> Validated:
    """Check everything that can be checked without Slurm; collect every problem (never raises for a mistake).
    `job_types`: the registered job types (rlkit.jobs.validate hands them in); config.type's record says what its job
    is made of, and its own checks run among these."""
    problems = Problems()
    check_strings(config, problems)
    check_ranges(config, problems)
    with problems.check():
        check_name("experiment_name", config.experiment_name)
    with problems.check():
        check_name("trial_name", config.trial_name)
    job: JobType | None = None
    with problems.check():
        job = job_types.named(config.type)
    _validate_cluster(config, problems)
    _validate_launcher(config, problems, job)
    validate_min_new_tokens(config, problems)
    validate_stop(config, problems)
    validate_greedy(config, problems, trains_on_rollouts=job is not None and job.needs_servers and job.trainer)
    if evaluation_enabled(config.evaluator) and job is not None and "evaluator" not in job.sections and \
            "valid_dataset" in job.sections:  # a job type with neither: rlkit.checks.unread_knobs refuses them
        _validate_epoch_evaluation(config, job, problems)
    allocation = None
    with problems.check():
        allocation = parse_allocation(config.allocation_mode)
    fits = False
    if allocation is not None and job is not None:
        fits = check_layout(job, allocation, config.allocation_mode, problems)
        _validate_models(config, job, allocation, problems)
        if config.launcher.slurm.container_type == "apptainer":
            check_image_labels(config, allocation, problems)
        validate_host_python(config, job, allocation, problems)
    if job is not None:
        _validate_lora(config, job, job_types, allocation, problems)
        validate_weight_delta(config, allocation, problems)
        _validate_scratch(config, job, job_types, problems)
        validate_reference(config, job, job_types, problems)
        validate_sequence_parallel(config, job, job_types, allocation, problems)
        validate_unread_knobs(config, job, job_types, problems)
        job.validate(config, allocation, problems)
        validate_agent(config, job, job_types, problems, servers_context(config, allocation))
    validate_auxiliary(config, job, job_types, allocation, problems)
    validate_reward_model_servers(config, job, allocation, problems)
    return Validated(config, allocation if fits else None, problems)


def _validate_cluster(config: ExperimentConfig, problems: Problems) -> None:
    cluster = config.cluster
    if not cluster.fileroot.startswith("/"):
        problems.add(f"cluster.fileroot '{cluster.fileroot}' must be an absolute path on the shared filesystem",
                     hint="e.g. cluster.fileroot=/shared/$USER/rlkit (a config reading ${oc.env:RLKIT_FILEROOT,...} "
                     "takes it from RLKIT_FILEROOT)")
    elif not _SAFE_PATH.fullmatch(cluster.fileroot):
        problems.add(f"cluster.fileroot {cluster.fileroot!r} has characters Slurm's #SBATCH lines and file "
                     "patterns cannot carry (spaces, quotes, ',', ':', '%', '$', ';', '\\' or newlines)",
                     hint="use a path of letters, digits and . _ - + / @ only")
    else:
        with problems.check():
            check_writable_root("cluster.fileroot",
                                TrialPaths.of(cluster.fileroot, config.experiment_name, config.trial_name).root)
    record_root = cluster.name_resolve.nfs_record_root
    if record_root.startswith("/") and not _SAFE_PATH.fullmatch(record_root):
        problems.add(f"cluster.name_resolve.nfs_record_root {record_root!r} has characters that container binds and "
                     "job scripts cannot carry (spaces, quotes, ',', ':', '%', '$', ';', '\\')",
                     hint="use a path of letters, digits and . _ - + / @ only")
    _validate_name_resolve(config, problems)
    if cluster.name_resolve.type not in NAME_RESOLVE_TYPES:
        problems.add(f"cluster.name_resolve.type '{cluster.name_resolve.type}' is not supported",
                     hint=f"choose one of: {', '.join(NAME_RESOLVE_TYPES)}")
    if record_root and not record_root.startswith("/"):
        problems.add(f"cluster.name_resolve.nfs_record_root '{record_root}' must be an absolute path on the shared "
                     "filesystem", hint="leave it empty to keep the records in the trial directory")


def _validate_name_resolve(config: ExperimentConfig, problems: Problems) -> None:
    """A shared record root must not be another user's; etcd's address, TLS files and credentials must be usable."""
    import os

    nr = config.cluster.name_resolve
    if nr.type == "nfs" and nr.nfs_record_root.startswith("/"):
        from rlkit.nameresolve.records import untrusted_directory

        mine = os.path.join(nr.nfs_record_root, str(os.getuid()))
        bad = untrusted_directory(mine, mine) if os.path.lexists(mine) else None
        if bad:
            problems.add(f"cluster.name_resolve.nfs_record_root: {bad[0]} {bad[1]}, so records there cannot be "
                         "trusted", hint="leave nfs_record_root empty (records in the trial directory), or remove "
                                         f"{mine} and let rlkit create it", site=True)
    if nr.type != "etcd3":
        return
    from rlkit.nameresolve.servers import check_address

    address = nr.etcd3_addr.removeprefix("https://").removeprefix("http://").rstrip("/")
    try:
        check_address(address)
    except ValueError as exc:
        problems.add(f"cluster.name_resolve.etcd3_addr: {exc}", hint="e.g. etcd3_addr=etcd01:2379")
    if bool(nr.etcd3_cert) != bool(nr.etcd3_key):
        problems.add("cluster.name_resolve.etcd3_cert and etcd3_key go together (a client certificate and its key)",
                     hint="set both, or neither")
    for name in ("etcd3_cacert", "etcd3_cert", "etcd3_key"):
        path = getattr(nr, name)
        if path and not (path.startswith("/") and _SAFE_PATH.fullmatch(path)):
            problems.add(f"cluster.name_resolve.{name} {path!r} must be an absolute path of letters, digits and "
                         ". _ - + / @ (it is bound into containers as it is)", hint="e.g. /etc/etcd/ca.pem")
        elif path and not os.access(path, os.R_OK):
            problems.add(f"cluster.name_resolve.{name}: '{path}' is not a readable file", site=True,
                         hint="give the path of the PEM file on the shared filesystem")
        elif name == "etcd3_key" and path and os.stat(path).st_mode & 0o077:
            problems.add(f"cluster.name_resolve.etcd3_key: '{path}' can be read by other users",
                         hint=f"chmod 600 {path}")
    tls = bool(nr.etcd3_cacert) or nr.etcd3_addr.startswith("https://")
    if nr.etcd3_user and not tls:
        problems.add("cluster.name_resolve.etcd3_user is set but etcd is reached over plain http: the password and "
                     "the auth token would cross the network readable to anyone on it",
                     hint="set cluster.name_resolve.etcd3_cacert (https) as well, or drop etcd3_user")
    if nr.etcd3_user and not os.environ.get("ETCDCTL_PASSWORD"):
        problems.add(f"cluster.name_resolve.etcd3_user is '{nr.etcd3_user}' but $ETCDCTL_PASSWORD is not set here "
                     "(the job's steps inherit it from the submitting shell)",
                     hint="export ETCDCTL_PASSWORD before rlkit submit", site=True)


def _validate_launcher(config: ExperimentConfig, problems: Problems, job: JobType | None) -> None:
    launcher = config.launcher
    for name in ("inference_server_env_vars", "trainer_env_vars"):
        with problems.check():
            parse_env_vars(f"launcher.{name}", getattr(launcher, name))
    slurm = launcher.slurm
    if slurm.time:
        _validate_time(config, problems, job)
    for name in ("srun_additional_args", "sbatch_additional_args", "apptainer_args"):
        try:
            words = shlex.split(getattr(slurm, name))
        except ValueError as exc:
            problems.add(f"launcher.slurm.{name} cannot be split into arguments: {exc}",
                         hint="close the quote, or quote a value with spaces like --comment='two words'")
            continue
        for word in words:
            if any(_is_option(word, option) for option in _RLKIT_SETS.get(name, ())):
                problems.add(f"launcher.slurm.{name}: rlkit sets {word.split('=', 1)[0]} itself "
                             f"({_WHY_RLKIT_SETS.get(name, _WHY_DIRECTORY)})",
                             hint=f"remove {word} from launcher.slurm.{name}")
    if slurm.container_type not in CONTAINER_TYPES:
        problems.add(f"launcher.slurm.container_type '{slurm.container_type}' is not supported",
                     hint=f"choose one of: {', '.join(CONTAINER_TYPES)}")
    if slurm.container_type == "apptainer":
        check_binds(config, problems)
    elif slurm.container_type == "none":
        _refuse_container_fields(slurm, problems)
    if slurm.container_type == "apptainer":
        for name in ("inference_server_image", "trainer_image"):
            with problems.check():
                check_image(f"launcher.slurm.{name}", getattr(slurm, name))


def _refuse_container_fields(slurm: SlurmConfig, problems: Problems) -> None:
    """container_type none runs steps on the bare host: an image, a bind or apptainer's own arguments would be
    ignored without a word, and the user would believe the run used them."""
    refuse_inert_fields(problems, slurm, "launcher.slurm",
                        because="launcher.slurm.container_type is none (steps run on the bare host)",
                        hint="remove {field}, or set launcher.slurm.container_type=apptainer",
                        names=("trainer_image", "inference_server_image", "mount", "apptainer_args"))


def _is_option(word: str, option: str) -> bool:
    """Whether `word` gives `option`: exactly, with `=value`, a short option with its value attached (-D/x), or a
    long option abbreviated as getopt_long (srun) accepts (--chd=/x)."""
    name = word.split("=", 1)[0]
    if len(option) == 2:
        return word.startswith(option)
    return name == option or (name.startswith("--") and len(name) >= 5 and option.startswith(name))


def _validate_time(config: ExperimentConfig, problems: Problems, job: JobType | None) -> None:
    slurm = config.launcher.slurm
    try:
        seconds = slurm_time_seconds(slurm.time)
    except ValueError as exc:
        problems.add(f"launcher.slurm.time {exc}", hint="use minutes, MM:SS, HH:MM:SS or D-HH[:MM[:SS]], e.g. "
                                                        "2-00:00:00; quoting is not needed")
        return
    warning = config.recover.time_limit_warning
    recovers = job is not None and job.resumable and config.recover.mode != "disabled"
    if recovers and seconds is not None and seconds <= warning:
        problems.add(f"launcher.slurm.time {slurm.time} is not longer than recover.time_limit_warning ({warning} s):"
                     " Slurm would warn the trainer before it starts",
                     hint="give the job more time or lower recover.time_limit_warning")


def _validate_scratch(config: ExperimentConfig, job: JobType, job_types: JobTypes, problems: Problems) -> None:
    """actor.init_from_scratch where it means what it says: a random start for the one model that exists."""
    if not config.actor.init_from_scratch:
        return
    if not job.random_start:
        why = ("its servers start from actor.path's weights" if job.needs_servers else
               "its frozen reference is actor.path's weights")
        scratch = ", ".join(j.name for j in job_types if j.random_start)
        problems.add(f"actor.init_from_scratch with job type {job.name}: {why}, not the random start",
                     hint=f"set actor.init_from_scratch=false (a random start works with {scratch})")
    elif config.actor.use_lora:
        problems.add("actor.init_from_scratch with actor.use_lora: adapters on a random base",
                     hint="set one of them to false")


def _validate_lora(config: ExperimentConfig, job: JobType, job_types: JobTypes, allocation: Allocation | None,
                   problems: Problems) -> None:
    """LoRA only for job types whose trainer trains adapters (a set use_lora must never be silently ignored)."""
    from rlkit.checks.lora import validate_lora

    if config.actor.use_lora and not job.lora:
        reason = job.no_lora or "does not train LoRA adapters"
        lora_jobs = ", ".join(j.name for j in job_types if j.lora)
        problems.add(f"actor.use_lora is set, but job type {job.name} {reason}",
                     hint=f"set actor.use_lora=false (LoRA trains with job types {lora_jobs})")
        return
    validate_lora(config, problems, allocation)


def _validate_models(config: ExperimentConfig, job: JobType, allocation: Allocation, problems: Problems) -> None:
    """Local model directories the job will load must exist (hub ids are left to the servers), and a completion
    must fit the servers' context."""
    if allocation.server is None:
        return
    backend = backend_for(allocation.server.backend)
    for field_name, message in backend.extra_args_problems(getattr(config, backend.name).extra_args):
        problems.add(f"{field_name}: {message}")
    check_engine_env(config, backend, problems)
    model = server_model(config, backend.name)
    field = backend.model_field if model != config.actor.path else "actor.path"
    with problems.check():
        check_model_dir(field, model)
    if config.tokenizer_path:
        with problems.check():
            check_tokenizer_dir("tokenizer_path", config.tokenizer_path)
    limit, limit_field = backend.context_length(config), backend.context_field
    positions = model_positions(model)
    if limit is not None and positions is not None and limit > positions:
        problems.add(f"{limit_field} ({limit}) exceeds the model's context of {positions} tokens "
                     f"(max_position_embeddings of {model}): the servers would refuse to start",
                     hint=f"set {limit_field} to at most {positions}, or leave it unset (the model's own)")
    if limit is None:
        limit, limit_field = positions, f"the max_position_embeddings of {model}"
    if limit is None:
        return
    new = config.gconfig.max_new_tokens
    if new >= limit:
        problems.add(f"gconfig.max_new_tokens ({new}) leaves no room for a prompt in the servers' context of "
                     f"{limit} tokens ({limit_field}): every request would be rejected",
                     hint=f"lower gconfig.max_new_tokens below {limit}, or raise {limit_field}")
    prompt = get_field(config, f"{job.prompt_dataset}.max_length") if job.prompt_dataset else None
    if new < limit and prompt is not None and prompt + new > limit:
        problems.add(f"a prompt of up to {prompt} tokens (max_length) plus gconfig.max_new_tokens ({new}) exceeds "
                     f"the servers' context of {limit} tokens ({limit_field}): long prompts would be rejected",
                     hint=f"keep max_length + gconfig.max_new_tokens <= {limit}")
