"""Multi-stage runs: a config with `stages:` (Trinity-RFT's field) becomes one trial per stage, submitted as a chain
of Slurm jobs, each `afterok` the one before.

A stage is a mapping of the keys it changes plus its `stage_name`; everything else comes from the top level of the
file (mappings merge key by key, any other value is replaced). Stage `s` of trial `t` is the trial `t_s`. A stage
that trains a policy (JobType.passes_on) hands its `checkpoints/final` to the next stage as actor.path, unless that
stage names its own actor.path; the servers then load it too (an inherited vllm.model / sglang.model_path is
dropped). An rw stage's `checkpoints/final` becomes the reward model of the later stages that score with one
(rlkit.launch.stage_reward). Command-line overrides apply to every stage; `stages.<name>.<key>=value` to one. A knob
a stage inherits that its job type does not read, but another stage's does, is left out of it
(rlkit.launch.stage_knobs).
"""

from __future__ import annotations

import copy
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit.checks.site_files import make_paths_absolute
from rlkit.config.load import compose, read_yaml, typed_config
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError, ConfigErrors, SlurmError, UserError, each_error
from rlkit.jobs import REGISTRY, job_type_for
from rlkit.jobs.base import JobType
from rlkit.launch import slurm
from rlkit.launch.resume import archive_logs, say_recorded
from rlkit.launch.stage_knobs import StageKeys, drop_other_stages_knobs, stage_sets
from rlkit.launch.stage_reward import TrainedRewardModel, hand_over_reward_model
from rlkit.launch.submit import Prepared, prepare, prepare_config, submit
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import SLURM_JOB_ID, attempts, check_readable, find_trial
from rlkit.trials.recover_layout import latest_valid, recover_root
from rlkit.trials.stage_runs import StagedRun, StageRecord, find_run, record_run

STAGES_KEY = "stages"
_TOP_LEVEL_ONLY = ("experiment_name", "trial_name", STAGES_KEY)  # they name the run and its stage trials
_SERVER_MODEL_FIELDS = (("vllm", "model"), ("sglang", "model_path"))


@dataclass(frozen=True)
class StagePlan:
    """One stage ready to submit: its prepared job and its record in the run."""

    record: StageRecord
    prepared: Prepared


def has_stages(config_path: str | Path) -> bool:
    """Whether the config file describes a multi-stage run (a ConfigError when it cannot be read)."""
    return STAGES_KEY in read_yaml(Path(config_path))


def _merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """`base` with `changes` applied: mappings merge key by key, any other value replaces."""
    out = copy.deepcopy(base)
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _stage_entries(data: dict[str, Any], problems: Problems) -> list[tuple[str, dict[str, Any]]]:
    """(stage_name, the stage's own keys) in order; every malformed entry is reported."""
    stages = data.get(STAGES_KEY)
    if not isinstance(stages, list) or not stages:
        problems.add("stages must be a list of stages, each a mapping with its stage_name",
                     hint="e.g. stages: [{stage_name: warmup, type: sft}, {stage_name: rl, type: grpo}]")
        return []
    entries: list[tuple[str, dict[str, Any]]] = []
    for i, entry in enumerate(stages):
        if not isinstance(entry, dict):
            problems.add(f"stages[{i}] is a {type(entry).__name__}, not a mapping",
                         hint="write each stage as a mapping with stage_name and the keys it changes")
            continue
        own = dict(entry)
        name = own.pop("stage_name", None)
        if not isinstance(name, str) or not name:
            problems.add(f"stages[{i}] has no stage_name", hint="name every stage, e.g. stage_name: warmup")
            continue
        for key in _TOP_LEVEL_ONLY:
            if key in own:
                problems.add(f"stage {name} sets {key}, which only the top level may set (it names the run)",
                             hint=f"move {key} to the top of the file")
                own.pop(key)
        if isinstance(own.get("cluster"), dict) and "fileroot" in own["cluster"]:
            problems.add(f"stage {name} sets cluster.fileroot: every stage of a run lives under one fileroot",
                         hint="set cluster.fileroot at the top level only")
        if any(name == seen for seen, _ in entries):
            problems.add(f"two stages are named {name}", hint="give every stage its own stage_name")
            continue
        entries.append((name, own))
    return entries


def _split_overrides(overrides: list[str], names: list[str], problems: Problems
                     ) -> tuple[list[str], dict[str, list[str]]]:
    """(overrides for every stage, `stages.<name>.` overrides by stage)."""
    common: list[str] = []
    own: dict[str, list[str]] = {name: [] for name in names}
    for item in overrides:
        if not item.startswith(f"{STAGES_KEY}."):
            common.append(item)
            continue
        name, _, rest = item[len(STAGES_KEY) + 1:].partition(".")
        if name not in own or not rest:
            problems.add(f"override '{item}' names no stage of this run ({', '.join(names)})",
                         hint="write stages.<stage_name>.<key>=value, or key=value for every stage")
            continue
        own[name].append(rest)
    return common, own


def _stage_trial_name(mapping: dict[str, Any], overrides: list[str], stage: str
                      ) -> tuple[dict[str, Any], list[str]]:
    """The stage's trial is `<trial_name>_<stage>`: the suffix goes onto the value that sets trial_name (the last
    override, else the file's, `${...}` included) before anything is resolved, so a `${trial_name}` elsewhere in
    the file (a tensorboard path) names the stage's trial."""
    setting = [i for i, o in enumerate(overrides) if o.split("=", 1)[0].strip() == "trial_name"]
    if setting:
        overrides = list(overrides)
        overrides[setting[-1]] = f"{overrides[setting[-1]]}_{stage}"
    elif mapping.get("trial_name") is not None:
        mapping = {**mapping, "trial_name": f"{mapping['trial_name']}_{stage}"}
    return mapping, overrides


def _sets(own_keys: dict[str, Any], own_overrides: list[str], section: str, field: str) -> bool:
    """Whether the stage itself (its mapping or its own overrides) sets `section.field`."""
    return stage_sets(own_keys, own_overrides, f"{section}.{field}")


@dataclass
class ComposedStage:
    """One stage's config before any check: composed from the file and chained to the stage before. `config` None:
    the loader could not build it (`problems` says why). `model_stand_in`, `reward_stand_in`: see StageRecord."""

    name: str
    config: ExperimentConfig | None
    problems: Problems
    model_stand_in: str = ""
    reward_stand_in: str = ""


def compose_stages(config_path: str | Path, overrides: list[str], problems: Problems) -> list[ComposedStage]:
    """Every stage's config, merged from the file's top level and the stage, overrides applied, the model chained
    (pure apart from reading the file: no check of the site's files). Problems of the stages list itself, and a
    stage that trains nothing, go to `problems`; each stage's loader problems stay with the stage."""
    path = Path(config_path)
    data = read_yaml(path)
    entries = _stage_entries(data, problems)
    common, own_overrides = _split_overrides(overrides, [name for name, _ in entries], problems)
    base = {k: v for k, v in data.items() if k != STAGES_KEY}
    stages: list[ComposedStage] = []
    policy: tuple[str, str] | None = None  # (final checkpoint, the model its checks read) of the last policy stage
    reward: TrainedRewardModel | None = None  # the last rw stage's
    keys: list[StageKeys] = []  # what each stage sets itself: knobs it inherits but does not read are dropped
    for name, own in entries:
        stage_problems = Problems()
        mapping, stage_overrides = _stage_trial_name(_merge(base, own), [*common, *own_overrides[name]], name)
        config = typed_config(compose(mapping, stage_overrides, source=str(path), problems=stage_problems,
                                     job_types=REGISTRY))
        if config is None:
            stages.append(ComposedStage(name, None, stage_problems))
            continue
        job = _registered(config.type)
        if job is not None and not job.trainer:
            problems.add(f"stage {name} is a {job.name} job, which trains nothing to pass on",
                         hint=f"a stage trains a model ({', '.join(_trainers())}); run {job.name} as a trial "
                              "of its own")
            continue
        make_paths_absolute(config, os.getcwd())
        stand_in = ""
        if policy is not None and not _sets(own, own_overrides[name], "actor", "path"):
            if config.ref.path == config.actor.path and not _sets(own, own_overrides[name], "ref", "path"):
                config.ref.path = ""  # the reference named the actor's start (`${actor.path}`): it follows it
            config.actor.path, stand_in = policy
            for section, field in _SERVER_MODEL_FIELDS:
                if not _sets(own, own_overrides[name], section, field):
                    setattr(getattr(config, section), field, "")
        reward_stand_in = hand_over_reward_model(
            name, config, job, reward, functools.partial(_sets, own, own_overrides[name]), problems)
        if reward_stand_in is None:
            continue
        final = str(TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name).checkpoints
                    / "final")
        if job is not None and job.passes_on == "policy":
            policy = (final, stand_in or config.actor.path)
        elif job is not None and job.passes_on == "reward_model":
            reward = TrainedRewardModel(final, stand_in or config.actor.path)
        stages.append(ComposedStage(name, config, stage_problems, stand_in, reward_stand_in))
        if job is not None:
            keys.append(StageKeys(config, job, own, own_overrides[name]))
    drop_other_stages_knobs(keys, REGISTRY)
    return stages


def prepare_stages(config_path: str | Path, overrides: list[str], *, dry_run: bool = False, preflight: bool = False
                   ) -> tuple[list[StagePlan], list[ConfigError]]:
    """Compose, validate, plan and render every stage; raises every problem of every stage at once (each named by
    its stage). Returns the plans and, for a dry run, the site files missing here."""
    problems = Problems()
    plans: list[StagePlan] = []
    by_stage: dict[str, list[ConfigError]] = {}
    warnings: list[ConfigError] = []
    for stage in compose_stages(config_path, overrides, problems):
        if stage.config is None:
            by_stage[stage.name] = stage.problems.errors
            continue
        try:
            prepared = prepare_config(stage.config, stage.problems, dry_run=dry_run,
                                      model_stand_in=stage.model_stand_in, reward_stand_in=stage.reward_stand_in,
                                      preflight=preflight)
        except ConfigError as exc:
            by_stage[stage.name] = list(each_error(exc))  # type: ignore[arg-type]
            continue
        warnings.extend(ConfigError(f"stage {stage.name}: {w.message}", hint=w.hint, site=True)
                        for w in prepared.warnings)
        record = StageRecord(stage.name, stage.config.type, stage.config.trial_name, str(prepared.paths.root),
                             stage.model_stand_in, stage.reward_stand_in)
        plans.append(StagePlan(record, prepared))
    problems.errors.extend(_by_problem(by_stage))
    problems.raise_if_any()
    return plans, warnings


def handed_over(plan: StagePlan) -> list[tuple[str, str]]:
    """(key, path) of each model the stage takes from an earlier stage's final checkpoint (what render shows)."""
    config, record = plan.prepared.config, plan.record
    out = [("actor.path", config.actor.path)] if record.model_stand_in else []
    if record.reward_stand_in:
        out.append(("reward.reward_model_path", config.reward.reward_model_path))
        if config.critic.path == config.reward.reward_model_path:
            out.append(("critic.path", config.critic.path))
    return out


def _registered(name: str) -> JobType | None:
    """The job type `name`, None when there is none (validation reports it with the list)."""
    try:
        return job_type_for(name)
    except ConfigError:
        return None


def _trainers() -> list[str]:
    return [job.name for job in REGISTRY if job.trainer]


def _by_problem(by_stage: dict[str, list[ConfigError]]) -> list[ConfigError]:
    """One error per problem, naming the stages it is found in (a top-level mistake is every stage's)."""
    stages_of: dict[tuple[str, str | None, bool], list[str]] = {}
    for stage, errors in by_stage.items():
        for error in errors:
            stages_of.setdefault((error.message, error.hint, error.site), []).append(stage)
    return [ConfigError(f"{'stages' if len(names) > 1 else 'stage'} {', '.join(names)}: {message}", hint=hint,
                        site=site) for (message, hint, site), names in stages_of.items()]


def submit_stages(plans: list[StagePlan], *, force: bool = False) -> StagedRun:
    """Submit every stage, each afterok the one before, and record the run. Every check runs before anything is
    written: the trials must be new (or `force`: submitted over, none of their jobs still in Slurm) and the
    controller must accept every script. If Slurm refuses a later stage, the earlier ones are cancelled."""
    problems = Problems()
    for plan in plans:
        paths = plan.prepared.paths
        if paths.config.exists() and not force:
            problems.add(f"stage {plan.record.name}: trial {plan.record.trial} already exists at {paths.root}",
                         hint="pick a new trial_name, or pass --force to submit over it")
        elif paths.config.exists():
            for attempt in attempts(paths):
                job_id = str(attempt.get("job_id"))
                if SLURM_JOB_ID.fullmatch(job_id) and slurm.is_trials_active_job(
                        slurm.job_info(job_id), plan.prepared.config.experiment_name, plan.record.trial, paths.root):
                    problems.add(f"stage {plan.record.name}: trial {plan.record.trial} still has job {job_id} in "
                                 "Slurm", hint=f"stop it first: rlkit stop {plan.prepared.config.experiment_name}/"
                                               f"{plan.record.trial}")
    problems.raise_if_any()
    for plan in plans:
        slurm.sbatch_test_only(plan.prepared.script)
    submitted: list[str] = []
    for plan in plans:
        try:
            job_id = submit(plan.prepared, force=force, after_ok=submitted[-1] if submitted else "").record.job_id
        except (SlurmError, UserError) as exc:
            for earlier in submitted:
                slurm.scancel(earlier)
            raise SlurmError(f"stage {plan.record.name} could not be submitted ({exc}); the stages before it "
                             f"(jobs {', '.join(submitted) or 'none'}) were cancelled") from exc
        submitted.append(job_id)
    config = plans[0].prepared.config
    run = StagedRun(config.experiment_name, config.trial_name.removesuffix(f"_{plans[0].record.name}"),
                    tuple(plan.record for plan in plans), time.time())
    record_run(run)
    return run


def _last_job(stage: StageRecord) -> str:
    """The stage's last job id from its manifest; "" for none, or for one that is not a Slurm job id (argv)."""
    found = attempts(stage.paths)
    job_id = str(found[-1].get("job_id")) if found else ""
    return job_id if SLURM_JOB_ID.fullmatch(job_id) else ""


def resume_run(run: StagedRun, overrides: list[str]) -> list[tuple[StageRecord, str, str]]:
    """Continue a run from its first unfinished stage: that stage resumes from its last recover checkpoint (or
    starts again when it has none), every later stage is submitted again after it. Returns (stage, job id, how)."""
    for stage in run.stages:
        job_id = _last_job(stage)
        if job_id and slurm.job_info(job_id).active:
            raise UserError(f"stage {stage.name} of {run.name} is still in Slurm as job {job_id}",
                            hint=f"wait for it, or stop it first: rlkit stop {run.experiment}/{stage.trial}")
    unfinished = [i for i, stage in enumerate(run.stages) if not stage.finished()]
    if not unfinished:
        raise UserError(f"every stage of {run.name} finished", hint="submit a new trial to train again")
    common, own = _split_overrides(overrides, [s.name for s in run.stages], problems := Problems())
    problems.raise_if_any()
    prepared: list[tuple[StageRecord, Prepared, str]] = []
    errors: list[ConfigError] = []
    for stage in run.stages[unfinished[0]:]:
        paths = stage.paths
        again = stage is run.stages[unfinished[0]] and latest_valid(recover_root(paths.root), warn=False,
                                                                   checksums=False) is not None
        mode = ["recover.mode=resume"] if again else []
        try:
            prepared.append((stage, prepare(paths.config, [*mode, *common, *own[stage.name]],
                                            attempt=len(attempts(paths)) + 1 if again else 1,
                                            model_stand_in=stage.model_stand_in,
                                            reward_stand_in=stage.reward_stand_in, preflight=True, recorded=True),
                             "resumed" if again else "again"))
        except ConfigError as exc:
            errors.extend(ConfigError(f"stage {stage.name}: {e.message}", hint=e.hint) for e in each_error(exc))
    if errors:
        raise ConfigErrors(errors) if len(errors) > 1 else errors[0]
    for stage, plan, _ in prepared:
        say_recorded(plan.warnings, [*common, *own[stage.name]], f"stage {stage.name}: ")
    for _, plan, _ in prepared:
        slurm.sbatch_test_only(plan.script)
    out: list[tuple[StageRecord, str, str]] = []
    for stage, plan, how in prepared:
        after = out[-1][1] if out else ""
        done = len(attempts(stage.paths)) or 1
        if how == "resumed":
            job_id = submit(plan, force=True, kind="resume", after_ok=after,
                            before_write=functools.partial(archive_logs, stage.paths, done)).record.job_id
        else:
            job_id = submit(plan, force=True, after_ok=after).record.job_id
        out.append((stage, job_id, how))
    return out


def find_stage_run(spec: str) -> StagedRun | None:
    """The run `spec` names, unless it names an ordinary trial (a stage trial is one: `t_s`)."""
    run = find_run(spec)
    if run is None:
        return None
    try:
        find_trial(spec)
    except UserError:
        for stage in run.stages:
            check_readable(stage.trial_dir, f"{run.name} (stage {stage.name})")
        return run
    return None


def stop_run(run: StagedRun, *, now: bool, timeout: float, say: Callable[[str], None]) -> list[str]:
    """Stop a run: the stages still waiting are cancelled first (so none starts from a model not finished), then the
    running one stops as `rlkit stop` stops a trial (checkpoint first). Returns the stages stopped."""
    from rlkit.launch.stop import stop_trial

    active = [(stage, job) for stage in run.stages if (job := _last_job(stage))
              and slurm.is_trials_active_job(slurm.job_info(job), run.experiment, stage.trial, stage.trial_dir)]
    if not active:
        raise UserError(f"no stage of {run.name} is in Slurm", hint=f"rlkit status {run.name} shows how it ended")
    for stage, job in reversed(active):
        if slurm.job_info(job).state == "PENDING":
            slurm.scancel(job)
            say(f"cancelled stage {stage.name} (job {job}, pending)")
    for stage, job in active:
        if slurm.job_info(job).active:
            stop_trial(f"{run.experiment}/{stage.trial}", now=now, timeout=timeout, say=say)
            say(f"stopped stage {stage.name} (job {job})")
    return [stage.name for stage, _ in active]
