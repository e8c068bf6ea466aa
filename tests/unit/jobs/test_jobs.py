"""The job-type registry: the one list of job types, what each declares, and what the launch side makes of it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rlkit.config.load import load_config
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import ConfigError
from rlkit.jobs import JOB_TYPES, JobType, job_type_for, registered_job_types
from rlkit.launch.plan import CLIENT_ROLE, SERVER_ROLE, TRAINER_ROLE
from tests.helpers.planning import plan_of


def test_unknown_type_is_refused_with_the_closest_name() -> None:
    with pytest.raises(ConfigError) as info:
        job_type_for("gpro")
    assert "type 'gpro' is not a job type" in info.value.message
    assert info.value.hint is not None and "did you mean 'grpo'?" in info.value.hint
    assert all(name in info.value.hint for name in JOB_TYPES)


def test_a_name_like_none_gets_the_list_without_a_guess() -> None:
    with pytest.raises(ConfigError) as info:
        job_type_for("zzzz")
    assert info.value.hint is not None and "did you mean" not in info.value.hint


def test_registry_holds_every_job_type() -> None:
    assert set(JOB_TYPES) == {"generate", "grpo", "ppo", "opmd", "sft", "rw", "dpo", "distill"}
    assert [job.name for job in registered_job_types()] == list(JOB_TYPES)


def test_the_job_type_facts_checks_ask_are_those_the_names_used_to_stand_for() -> None:
    """The facts that replaced name lists in checks and config (ROLLOUT_TRAINERS, KL_JOB_TYPES, SCRATCH_JOB_TYPES,
    `type == "dpo"`, `type == "rw"`) give the same job types."""
    def having(fact: str) -> set[str]:
        return {job.name for job in registered_job_types() if getattr(job, fact)}

    assert having("trains_on_rollouts") == {"grpo", "ppo", "opmd", "distill"}
    assert having("kl_terms") == {"grpo", "ppo", "opmd", "distill"}
    assert having("random_start") == {"sft", "rw"}
    assert having("always_reference") == {"dpo"}
    assert having("trains_value_model") == {"rw"}


def test_declared_sections_and_prompt_datasets_are_fields_of_the_schema() -> None:
    fields = {f.name for f in dataclasses.fields(ExperimentConfig)}
    for job in registered_job_types():
        assert set(job.sections) <= fields, job.name
        if job.prompt_dataset:
            assert job.prompt_dataset.split(".")[0] in fields, job.name
        assert job.needs_servers or job.trainer, f"{job.name} has neither servers nor a trainer: nothing would run"


def test_type_help_lists_no_choices_that_could_drift() -> None:
    help_text = next(f for f in dataclasses.fields(ExperimentConfig) if f.name == "type").metadata["help"]
    assert not any(name in help_text.split() for name in JOB_TYPES)


def _layout(job: JobType) -> str:
    return {(True, True): "vllm:d1+fsdp:d1", (True, False): "vllm:d1", (False, True): "fsdp:d1"}[
        (job.needs_servers, job.trainer)]


@pytest.mark.parametrize("name", JOB_TYPES)
def test_each_job_type_plans_the_components_it_declares(generate_yaml: Path, name: str) -> None:
    job = job_type_for(name)
    plan = plan_of(load_config(generate_yaml, [f"type={name}", f"allocation_mode={_layout(job)}"]))
    roles = [c.role for c in plan.components]
    assert roles == [*([SERVER_ROLE] if job.needs_servers else []), TRAINER_ROLE if job.trainer else CLIENT_ROLE]
    work = plan.steps[-1]
    assert work.name == name and work.het_group == len(roles) - 1 == plan.trainer_group
    assert work.argv[-3] == ("train" if job.trainer else "client")
    assert ("--requeue" in plan.job_options) == job.resumable and (plan.retries > 0) == job.resumable


def test_every_step_names_a_function_of_its_module() -> None:
    """`rlkit train`/`rlkit client` call module:function in the job; a typo there would fail only on the cluster.
    Read from the source (importing the trainer would take seconds)."""
    import ast
    import importlib.util

    for job in registered_job_types():
        module, _, function = job.step.partition(":")
        spec = importlib.util.find_spec(module)
        assert spec is not None and spec.origin is not None, job.step
        tree = ast.parse(Path(spec.origin).read_text())
        assert any(isinstance(node, ast.FunctionDef) and node.name == function for node in tree.body), job.step


def test_a_script_whose_command_does_not_match_the_job_type_is_refused(generate_yaml: Path, tmp_path: Path) -> None:
    """The in-job dispatcher runs the trial's job type only from the command its component runs."""
    from rlkit.config.load import load_config, to_yaml
    from rlkit.errors import FatalStepError
    from rlkit.jobs.run import run_job_step

    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "config.yaml").write_text(to_yaml(load_config(generate_yaml)))
    with pytest.raises(FatalStepError, match="job type generate runs `rlkit client`"):
        run_job_step(trial, trainer=True)


def test_die_at_start_fails_every_run_of_any_job_type_as_it_starts(generate_yaml: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The crash-loop test's fault (RLKIT_FAULT_INJECT=die_at_start) fires in the dispatcher, in a retry too, so the
    trial it runs in needs no particular job type (tests/integration/test_recovery_steps_fail.py runs an sft one)."""
    from rlkit.config.load import load_config, to_yaml
    from rlkit.errors import FatalStepError, StepError
    from rlkit.jobs.run import run_job_step

    trial = tmp_path / "trial"
    trial.mkdir()
    (trial / "config.yaml").write_text(to_yaml(load_config(generate_yaml)))
    monkeypatch.setenv("RLKIT_FAULT_INJECT", "die_at_start")
    monkeypatch.setenv("RLKIT_STEP_RETRY", "2")
    with pytest.raises(StepError, match=r"^fault injected: die_at_start$") as failed:
        run_job_step(trial, trainer=False)
    assert not isinstance(failed.value, FatalStepError), "a crash loop is retried once, not failed at once"


@pytest.mark.parametrize("name", [job.name for job in registered_job_types() if not job.lora])
def test_use_lora_is_refused_where_the_job_type_does_not_train_adapters(generate_yaml: Path, name: str) -> None:
    """A set actor.use_lora must never be silently ignored: job types without LoRA training refuse it by name."""
    from rlkit.jobs.validate import validate

    job = job_type_for(name)
    config = load_config(generate_yaml, [f"type={name}", f"allocation_mode={_layout(job)}", "actor.use_lora=true",
                                         "actor.target_modules=[q_proj]"])
    messages = [str(e) for e in validate(config).problems.errors]
    reason = job.no_lora or "does not train LoRA adapters"
    assert any(f"actor.use_lora is set, but job type {name} {reason}" in m for m in messages), messages


def test_lora_job_types_and_rw_says_why_it_has_none() -> None:
    """sft, dpo, grpo, ppo and opmd train adapters; rw refuses with its own reason (a value head trained whole)."""
    assert {job.name for job in registered_job_types() if job.lora} == {"grpo", "ppo", "opmd", "sft", "dpo"}
    assert "value head" in job_type_for("rw").no_lora
