"""A knob the job type reads only while another setting is on is refused when that setting is off
(rlkit.checks.conditional_knobs, walked by rlkit.checks.unread_knobs), one problem per field naming it, what is off
and the fix; with the setting on it is accepted. Through `rlkit render`'s own path (rlkit.launch.submit.prepare),
once through the CLI itself (exit 2), and once as `rlkit resume` of a trial recorded with such a knob."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.checks.conditional_knobs import CONDITIONAL_KNOBS
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.errors import ConfigError
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit


def refusal(path: Path, overrides: list[str]) -> str:
    """Every problem `rlkit render` reports for the config, with their fixes, on one line each."""
    with pytest.raises(ConfigError) as info:
        prepare(path, overrides, dry_run=True)
    return str(info.value)


def _refused(said: str, field: str, because: str, fix: str) -> None:
    assert f"{field} is set, but {because}: it would be ignored" in said, (field, said)
    assert f"fix: remove {field}, or {fix}" in said, (field, said)


def test_the_lora_knobs_without_use_lora_are_refused_and_accepted_with_it(grpo_yaml: Path) -> None:
    knobs = ["actor.lora_rank=8", "actor.lora_alpha=32", "actor.target_modules=[q_proj]"]
    said = refusal(grpo_yaml, knobs)
    for field in ("actor.lora_rank", "actor.lora_alpha", "actor.target_modules"):
        _refused(said, field, "actor.use_lora is false (no LoRA adapters are trained)", "set actor.use_lora=true")
    prepare(grpo_yaml, ["actor.lora_rank=32", "actor.lora_alpha=16"], dry_run=True)  # the defaults: no setting
    actor = prepare(grpo_yaml, ["actor.use_lora=true", *knobs], dry_run=True).config.actor
    assert (actor.lora_rank, actor.lora_alpha, actor.target_modules) == (8, 32, ["q_proj"])


def test_the_mix_knobs_without_expert_rows_are_refused_and_read_with_them(grpo_yaml: Path, tmp_path: Path) -> None:
    knobs = ["mix.mu=0.5", "sft.prompt_key=question", "expert_dataset.batch_size=2"]
    said = refusal(grpo_yaml, knobs)
    for field in ("mix.mu", "sft.prompt_key", "expert_dataset.batch_size"):
        _refused(said, field, "expert_dataset.path is not set (the SFT+RL mix is off)",
                 "set expert_dataset.path to the expert rows")
    rows = tmp_path / "expert.jsonl"
    rows.write_text("".join(json.dumps({"question": f"{i}+1=", "response": f" {i + 1}"}) + "\n" for i in range(4)))
    config = prepare(grpo_yaml, [*knobs, f"expert_dataset.path={rows}"], dry_run=True).config
    assert (config.mix.mu, config.sft.prompt_key, config.expert_dataset.batch_size) == (0.5, "question", 2)
    # the expert rows are read with the sft section's keys: the dataset's own, set otherwise, would be ignored
    said = refusal(grpo_yaml, [*knobs, f"expert_dataset.path={rows}", "expert_dataset.tools_key=functions",
                               "expert_dataset.prompt_key=instruction"])
    assert "expert_dataset.tools_key is 'functions', but sft rows are read with the sft section's keys " \
           "(sft.tools_key is 'tools')" in said
    assert "fix: set sft.tools_key=functions and remove expert_dataset.tools_key" in said
    assert "expert_dataset.prompt_key is 'instruction', but sft rows are read" in said
    prepare(grpo_yaml, [*knobs, f"expert_dataset.path={rows}", "expert_dataset.prompt_key=question"], dry_run=True)


def test_the_reward_of_a_generate_job_without_scoring_is_refused_and_read_when_it_scores(
        generate_yaml: Path, tmp_path: Path) -> None:
    knobs = ["reward.fn=exact_match", "reward.answer_key=truth", "generate.pass_threshold=0.5"]
    said = refusal(generate_yaml, knobs)
    for field in ("reward.fn", "reward.answer_key", "generate.pass_threshold"):
        _refused(said, field, "generate.score is false (the completions are not scored)", "set generate.score=true")
    prepare(generate_yaml, ["reward.fn=none"], dry_run=True)  # says what not scoring says: accepted
    rows = tmp_path / "scored.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"{i}+1=", "truth": str(i + 1)}) + "\n" for i in range(4)))
    config = prepare(generate_yaml, [*knobs, "generate.score=true", f"generate.dataset.path={rows}"],
                     dry_run=True).config
    assert (config.reward.fn, config.generate.pass_threshold) == ("exact_match", 0.5)


def test_a_kl_estimator_without_its_coefficient_is_refused_and_read_with_it(grpo_yaml: Path) -> None:
    said = refusal(grpo_yaml, ["actor.kl_estimator=k2", "actor.kl_loss_type=k1"])
    _refused(said, "actor.kl_estimator", "actor.kl_ctl is 0 (no KL reward penalty)", "set actor.kl_ctl > 0")
    _refused(said, "actor.kl_loss_type", "actor.kl_loss_coef is 0 (no KL loss term)", "set actor.kl_loss_coef > 0")
    prepare(grpo_yaml, ["actor.kl_estimator=k2", "actor.kl_ctl=0.01", "actor.kl_loss_type=k1",
                        "actor.kl_loss_coef=0.01"], dry_run=True)


def test_the_evaluation_sampling_without_the_evaluator_is_refused_and_read_with_it(grpo_yaml: Path) -> None:
    knobs = ["eval_gconfig.temperature=0.5", "evaluator.max_prompts=3"]
    said = refusal(grpo_yaml, knobs)
    for field in ("eval_gconfig.temperature", "evaluator.max_prompts"):
        _refused(said, field, "the evaluator never runs (no freq_steps, freq_epochs, freq_secs or eval_on_startup)",
                 "set evaluator.freq_steps (or another trigger)")
    data = str(grpo_yaml.parent / "train.jsonl")
    prepare(grpo_yaml, [*knobs, "evaluator.freq_steps=2", f"valid_dataset.path={data}"], dry_run=True)


def test_a_knob_of_a_part_the_job_type_never_reads_is_said_once(generate_yaml: Path) -> None:
    """generate has no trainer: LoRA's rank is refused as the trainer's knob, not again for use_lora."""
    said = refusal(generate_yaml, ["actor.lora_rank=8"])
    assert said.count("actor.lora_rank is set") == 1 and "job type generate has no trainer" in said, said


def test_the_cli_exits_2_naming_a_conditional_knob(grpo_yaml: Path, rlkit_home: Path) -> None:
    result = run_rlkit("render", str(grpo_yaml), "mix.mu=0.5", env={"RLKIT_HOME": str(rlkit_home)})
    assert result.returncode == 2, result.stderr
    assert "mix.mu is set, but expert_dataset.path is not set (the SFT+RL mix is off)" in result.stderr
    assert "Traceback" not in result.stderr and "#SBATCH" not in result.stdout


def test_a_resumed_trial_keeps_a_conditional_knob_with_a_warning(grpo_yaml: Path) -> None:
    """A trial an older rlkit accepted with such a knob resumes (attempt > 1): said, still ignored."""
    resumed = prepare(grpo_yaml, ["actor.lora_rank=8"], attempt=2, dry_run=True)
    said = [str(w) for w in resumed.warnings]
    assert any("actor.lora_rank is set, but actor.use_lora is false" in w for w in said), said


def test_every_field_of_the_table_is_a_field_of_the_schema() -> None:
    """A renamed field must not leave a row that silently never matches."""
    config = ExperimentConfig(experiment_name="e", trial_name="t", allocation_mode="vllm:d1+fsdp:d1")
    for condition in CONDITIONAL_KNOBS:
        for path in condition.fields:
            get_field(config, path)  # raises on a path that is no field


def test_the_section_of_a_backend_no_server_runs_is_a_warning_not_a_refusal(grpo_yaml: Path,
                                                                             rlkit_home: Path) -> None:
    """AReaL's files carry vllm and sglang both: the one no server runs is said (once, its fields together), the
    config accepted; AReaL's own defaults there (max_model_len 32768, ...) and the policy's path are no setting."""
    prepared = prepare(grpo_yaml, ["sglang.mem_fraction_static=0.5", "sglang.extra_args={attention_backend: fa3}",
                                   "sglang.context_length=32768", "vllm.gpu_memory_utilization=0.8"], dry_run=True)
    assert prepared.notes == (
        "sglang.mem_fraction_static, sglang.extra_args are set, but no server of this job runs sglang "
        "(allocation_mode's servers, auxiliary_models' backends): not used (remove them, or serve with sglang)",)
    assert not prepared.warnings and prepared.config.vllm.gpu_memory_utilization == 0.8  # the servers' own: read
    result = run_rlkit("render", str(grpo_yaml), "sglang.mem_fraction_static=0.5",
                       env={"RLKIT_HOME": str(rlkit_home)})
    assert result.returncode == 0, result.stderr
    assert "warning: sglang.mem_fraction_static is set, but no server of this job runs sglang" in result.stderr


def test_a_backend_an_auxiliary_model_runs_reads_its_section() -> None:
    """An auxiliary model served with SGLang beside vLLM policy servers reads sglang's python, env_vars, extra_args."""
    from rlkit.config.schema.auxiliary import AuxiliaryModelConfig

    sglang = next(c for c in CONDITIONAL_KNOBS if c.fields == ("sglang",))
    config = ExperimentConfig(experiment_name="e", trial_name="t", allocation_mode="vllm:d1+fsdp:d1")
    assert sglang.warn and sglang.off(config)
    config.auxiliary_models = [AuxiliaryModelConfig(name="judge", model_path="/m", backend="sglang")]
    assert not sglang.off(config)
    config.allocation_mode = "no such layout"  # refused elsewhere: nothing said here
    config.auxiliary_models = []
    assert not sglang.off(config)


def test_the_lora_knobs_of_a_trainer_that_trains_no_adapters_are_refused_saying_so() -> None:
    """rw trains every weight of a value model: its LoRA knobs are never read, whatever use_lora says (use_lora
    itself is refused for rw in its own words), so the fix is not 'set use_lora'."""
    from rlkit.checks.unread_knobs import conditionally_unread
    from rlkit.jobs import REGISTRY

    config = ExperimentConfig(experiment_name="e", trial_name="t", type="rw", allocation_mode="fsdp:d1")
    config.actor.lora_rank = 8
    found = [(c.because, c.fix, field) for c, field in conditionally_unread(config, REGISTRY.named("rw"), REGISTRY)]
    assert found == [("this job type trains no LoRA adapters", "train LoRA with a job type that does "
                      "(actor.use_lora)", "actor.lora_rank")]
