"""Submit: config -> validated plan -> script -> controller check -> trial directory -> sbatch -> index."""

from __future__ import annotations

import copy
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.checks.reward_model import pending_reward_model
from rlkit.checks.site_files import make_paths_absolute
from rlkit.config.allocation import canonical_mode
from rlkit.config.areal.accept import AcceptedKey
from rlkit.config.load import load_config_collecting, read_yaml, to_yaml
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError, SlurmError, UserError, each_error
from rlkit.jobs import REGISTRY, job_type_for
from rlkit.jobs.validate import validate
from rlkit.launch import slurm
from rlkit.launch.hub import NotInHubCache, has_hub_ids, resolve_hub_ids
from rlkit.launch.plan import JobPlan, plan_job
from rlkit.launch.preflight import preflight as site_preflight
from rlkit.launch.render import render_script
from rlkit.trials.lock import trial_lock
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import (
    TrialRecord,
    archive_run,
    list_trials,
    prepare_trial_dir,
    record_trial,
    restore_run,
    write_manifest,
)


@dataclass(frozen=True)
class Prepared:
    """A config that passed every check, with its plan and script (nothing written yet). `warnings`: problems with
    the site's files that a dry run tolerated, and the knobs a recorded trial keeps (ConfigError.recorded_ok; both
    empty for a new submit). `areal_keys`: AReaL keys of the config accepted without being used (the one notice;
    recorded in the manifest). `notes`: what the checks say without refusing (rlkit.config.problems.Problems.note:
    a section of a server backend the job does not run), printed as warnings."""

    config: ExperimentConfig
    plan: JobPlan
    script: str
    paths: TrialPaths
    warnings: tuple[ConfigError, ...] = ()
    areal_keys: tuple[AcceptedKey, ...] = ()
    notes: tuple[str, ...] = ()


def prepare(config_path: str | Path, overrides: list[str], *, attempt: int = 1, dry_run: bool = False,
            model_stand_in: str = "", reward_stand_in: str = "", preflight: bool = False,
            recorded: bool = False) -> Prepared:
    """Load, validate, plan and render (pure apart from reading the config and checking input paths). Raises
    ConfigErrors listing every problem found; with `dry_run`, missing site files are warnings instead. `preflight`:
    also hold the plan against the live partition (rlkit.launch.preflight; its problems come with the others).
    `recorded`: the config is a trial's record submitted again (a stage of `rlkit resume RUN`), as a resumed attempt
    (attempt > 1) is: what an older rlkit accepted and ignored is a warning (ConfigError.recorded_ok)."""
    problems = Problems()
    areal_keys: list[AcceptedKey] = []
    config = load_config_collecting(config_path, overrides, problems, REGISTRY, areal_keys)
    if config is None:
        problems.raise_if_any()
    assert config is not None
    if model_stand_in or reward_stand_in:
        model_stand_in, reward_stand_in = _recorded_stand_ins(Path(config_path), config, model_stand_in,
                                                              reward_stand_in)
    return prepare_config(config, problems, attempt=attempt, dry_run=dry_run, model_stand_in=model_stand_in,
                          reward_stand_in=reward_stand_in, preflight=preflight, areal_keys=tuple(areal_keys),
                          recorded=recorded)


def _recorded_stand_ins(config_path: Path, config: ExperimentConfig, model_stand_in: str,
                        reward_stand_in: str) -> tuple[str, str]:
    """A resumed stage's stand-ins (rlkit.launch.stages), kept only while actor.path and reward.reward_model_path are
    the ones its recorded config names (the finals handed over at submit): a path an override gives instead is that
    path, checked as it is, never taken for an earlier stage's final not written yet."""
    recorded = read_yaml(config_path)

    def named(section: str, field: str) -> object:
        values = recorded.get(section)
        return values.get(field) if isinstance(values, dict) else None

    keep_model = model_stand_in if config.actor.path == named("actor", "path") else ""
    keep_reward = reward_stand_in if config.reward.reward_model_path == named("reward", "reward_model_path") else ""
    return keep_model, keep_reward


def prepare_config(config: ExperimentConfig, problems: Problems | None = None, *, attempt: int = 1,
                   dry_run: bool = False, model_stand_in: str = "", reward_stand_in: str = "",
                   preflight: bool = False, areal_keys: tuple[AcceptedKey, ...] = (), fetch: bool = True,
                   recorded: bool = False) -> Prepared:
    """Validate, plan and render a loaded config; `problems` may already hold the loader's. `model_stand_in`: the
    model the checks read in place of actor.path, for a stage whose actor.path is an earlier stage's final
    checkpoint that exists only once that stage ran (the same architecture and tokenizer: the model it started
    from), used while actor.path does not exist; the plan and the script keep actor.path. Hub ids of models and
    datasets are fetched into the hub cache once every other check passed (`fetch`; a dry run only looks in the
    cache: rlkit.launch.hub)."""
    problems = problems if problems is not None else Problems()
    if fetch and not dry_run and has_hub_ids(config):
        _check_before_download(config, problems, attempt=attempt, model_stand_in=model_stand_in,
                               reward_stand_in=reward_stand_in, recorded=recorded)
    resolve_hub_ids(config, problems, download=fetch and not dry_run)
    make_paths_absolute(config, os.getcwd())
    real_model, real_ref, real_critic = config.actor.path, config.ref.path, config.critic.path
    if model_stand_in and not Path(real_model).exists():
        config.actor.path = model_stand_in
        if real_ref == real_model:  # the reference is that stage's model too
            config.ref.path = model_stand_in
        if real_critic == real_model:  # and the critic
            config.critic.path = model_stand_in
    rewards = config.reward.reward_model_path
    if reward_stand_in and real_critic == rewards and not Path(rewards).exists():
        config.critic.path = reward_stand_in  # the critic starts from the reward model (rlkit.launch.stages)
    with pending_reward_model(rewards, reward_stand_in):
        validated = validate(config)
    config.actor.path, config.ref.path, config.critic.path = real_model, real_ref, real_critic
    problems.errors.extend(validated.problems.errors)
    plan = None
    if validated.allocation is not None:
        try:
            with problems.check():
                plan = plan_job(config, validated.allocation, attempt=attempt)
        except ValueError:
            if problems.ok():
                raise
            # a value the planner could not read, already reported above (e.g. unbalanced quotes)
        # one form from here on, once the checks quoted the user's own (AReaL's `sglang.d4p1t1+d4p1t1` is recorded
        # as `sglang:d4+fsdp:d4`): the config.yaml the job reads
        config.allocation_mode = canonical_mode(validated.allocation)
    if preflight and plan is not None:
        slurm_cfg = config.launcher.slurm
        problems.errors.extend(site_preflight(plan, partition_name=slurm_cfg.partition,
                                              time_limit=slurm_cfg.time).errors)
    _drop_repeats(problems)
    # a resumed trial's recorded config may hold what an older rlkit accepted and ignored: said, not refused
    kept = problems.take_recorded_ok() if attempt > 1 or recorded else []
    problems.raise_if_any(allow_site=dry_run)
    assert plan is not None
    paths = TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name)
    return Prepared(config, plan, render_script(plan), paths, (*problems.site_warnings(), *kept), areal_keys,
                    tuple(validated.problems.notes))


def _check_before_download(config: ExperimentConfig, problems: Problems, *, attempt: int,
                           model_stand_in: str, reward_stand_in: str, recorded: bool) -> None:
    """Every problem of a config with hub ids, found before anything is downloaded (a config to be refused must not
    fetch gigabytes first): the checks run as render's, and any problem but an id not yet in the cache is raised."""
    try:
        prepare_config(copy.deepcopy(config), copy.deepcopy(problems), attempt=attempt,
                       model_stand_in=model_stand_in, reward_stand_in=reward_stand_in, fetch=False, recorded=recorded)
    except ConfigError as exc:
        checked = Problems()
        checked.errors.extend(e for e in each_error(exc) if isinstance(e, ConfigError)
                              and not isinstance(e, NotInHubCache))
        checked.raise_if_any()


def _drop_repeats(problems: Problems) -> None:
    """The planner re-reads some fields the checks already read; one report per problem."""
    seen: set[str] = set()
    unique = []
    for error in problems.errors:
        if str(error) not in seen:
            seen.add(str(error))
            unique.append(error)
    problems.errors[:] = unique


@dataclass(frozen=True)
class Submitted:
    """A submitted trial, and where `--force` moved the previous run's files (None: there was no previous run)."""

    record: TrialRecord
    archived: Path | None = None


def submit(prepared: Prepared, *, force: bool = False, kind: str = "submit",
           before_write: Callable[[], object] | None = None, after_ok: str = "",
           replaces_job: str = "") -> Submitted:
    """Check with the controller, write the trial directory, submit, and record the trial. `before_write` runs once
    every check passed, before anything is written (resume moves the previous attempt's logs there).

    `force` over an existing trial: a plain submit is a NEW run, so the previous run's files move to
    `<trial>/attempt-<N>/` (recover.mode=auto can then never resume the old run); a resume (kind "resume") keeps
    them, it continues that run. `after_ok`: a job this one waits for (rlkit.launch.slurm.sbatch). `replaces_job`:
    the job the caller found ended (resume); another one in the index by the time the lock is held was submitted
    meanwhile, and this submit is refused naming it (a controller too busy to say whether it runs cannot let a
    second one through)."""
    config, paths = prepared.config, prepared.paths
    _refuse_over_existing(config, paths, force=force, kind=kind)
    slurm.sbatch_test_only(prepared.script)
    with trial_lock(paths.root):  # the checks again, then write, submit and record, as one (rlkit.trials.lock)
        _refuse_over_existing(config, paths, force=force, kind=kind)
        if replaces_job:
            _refuse_if_submitted_meanwhile(paths, replaces_job)
        if before_write is not None:
            before_write()
        existed = paths.root.exists()
        archived = archive_run(paths) if force and kind == "submit" else None
        try:
            prepare_trial_dir(paths, config_yaml=to_yaml(config), script=prepared.script)
            job_id = slurm.sbatch(str(paths.script), after_ok=after_ok)
        except (SlurmError, OSError) as exc:
            if not existed:
                shutil.rmtree(paths.root, ignore_errors=True)
            elif archived is not None:
                restore_run(paths, archived)
            if isinstance(exc, OSError):
                raise UserError(f"cannot write the trial directory {paths.root}: {exc.strerror or exc}",
                                hint="check the filesystem of cluster.fileroot (space, permissions)") from None
            raise
        try:
            record = _record(prepared, job_id, kind=kind, after_ok=after_ok)
        except OSError as exc:  # a job nobody can find would run beside the next submit of the trial
            slurm.scancel(job_id)
            raise UserError(f"submitted job {job_id}, then could not record it ({exc.strerror or exc}); cancelled it",
                            hint="check the filesystems of cluster.fileroot and RLKIT_HOME, then submit again"
                            ) from None
    return Submitted(record, archived)


def _records_of(paths: TrialPaths) -> list[TrialRecord]:
    """The index records of the trial at `paths` (the user's other trials left out)."""
    return [record for record in list_trials() if record.trial_dir == str(paths.root)]


def _refuse_if_submitted_meanwhile(paths: TrialPaths, replaces_job: str) -> None:
    for record in _records_of(paths):
        if record.job_id != replaces_job:
            raise UserError(f"trial {record.name} was submitted again meanwhile, as job {record.job_id}",
                            hint=f"follow that one: rlkit status {record.name}")


def _refuse_over_existing(config: ExperimentConfig, paths: TrialPaths, *, force: bool, kind: str) -> None:
    """An existing trial is submitted over only with `force` (resume passes it) and never while a job of it is in
    Slurm: the one that is, by its index record, is named."""
    if not paths.config.exists():
        return
    if not force:
        raise UserError(f"trial {config.experiment_name}/{config.trial_name} already exists at {paths.root}",
                        hint="pick a new trial_name, or pass --force to submit over it")
    for record in _records_of(paths):
        if slurm.is_trials_active_job(slurm.job_info(record.job_id), record.experiment, record.trial,
                                      record.trial_dir):
            raise UserError(f"trial {record.name} still has job {record.job_id} in Slurm",
                            hint=f"stop it first: rlkit stop {record.name}")
    if kind == "submit" and job_type_for(config.type).resumable and config.recover.mode == "resume":
        raise UserError("--force starts a new run (the previous one moves to attempt-N/), so recover.mode=resume "
                        "would have nothing to resume",
                        hint=f"to continue the trial: rlkit resume {config.experiment_name}/{config.trial_name}")


def _record(prepared: Prepared, job_id: str, *, kind: str, after_ok: str) -> TrialRecord:
    """The submitted job in the trial's manifest and the per-user index."""
    config, paths = prepared.config, prepared.paths
    slurm_cfg = config.launcher.slurm
    images = {"inference_server": slurm_cfg.inference_server_image, "trainer": slurm_cfg.trainer_image}
    write_manifest(paths, job_id=job_id, images=images if slurm_cfg.container_type == "apptainer" else {},
                   cwd=Path.cwd(), kind=kind, cluster_name=config.cluster.cluster_name, after_ok=after_ok,
                   areal_keys=[key.to_dict() for key in prepared.areal_keys] or None)
    record = TrialRecord(config.experiment_name, config.trial_name, str(paths.root), job_id, time.time())
    record_trial(record)
    return record
