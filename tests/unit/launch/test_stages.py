"""Multi-stage runs on the login node (rlkit.launch.stages): how a `stages:` config becomes one prepared job per
stage, how the model passes from stage to stage, and that every problem of every stage is reported at once.
Submitting the chain to Slurm: tests/integration/test_stages_e2e.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlkit.config.load import load_config
from rlkit.errors import ConfigError, UserError, each_error
from rlkit.launch.stages import StagePlan, prepare_stages
from tests.conftest import CONFIGS

DEMO = CONFIGS / "sft-grpo-cpu-demo.yaml"


@pytest.fixture
def demo_dir(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the demo config reads (RLKIT_DEMO_DIR: the tiny model and both stages' data), fileroot in tmp."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    (tmp_path / "tiny-model").symlink_to(tiny_model_dir)
    write_sft_dataset(tmp_path)
    write_dataset(tmp_path / "digits.jsonl")
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(tmp_path))
    monkeypatch.setenv("RLKIT_FILEROOT", str(tmp_path / "fileroot"))
    monkeypatch.delenv("RLKIT_DEMO_TRIAL", raising=False)
    return tmp_path


def _problems(path: Path, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        prepare_stages(path, overrides or [])
    return [e.message for e in each_error(caught.value)]


def _with_stages(tmp_path: Path, change: dict[str, object]) -> Path:
    """The demo config with top-level keys replaced (e.g. a different stages list), written to tmp."""
    data = yaml.safe_load(DEMO.read_text())
    data.update(change)
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_demo_becomes_one_trial_per_stage_and_the_grpo_stage_starts_from_sfts_final(demo_dir: Path) -> None:
    plans, warnings = prepare_stages(DEMO, [])
    assert warnings == []
    assert [(p.record.name, p.record.type, p.record.trial) for p in plans] == [
        ("sft", "sft", "run1_sft"), ("grpo", "grpo", "run1_grpo")]
    sft, grpo = (p.prepared for p in plans)
    final = sft.paths.root / "checkpoints" / "final"
    assert sft.paths.root == demo_dir / "fileroot" / "demo-stages" / "run1_sft"
    assert sft.config.actor.path == str(demo_dir / "tiny-model") and plans[0].record.model_stand_in == ""
    assert grpo.config.actor.path == str(final) and grpo.config.vllm.model == ""
    assert plans[1].record.model_stand_in == str(demo_dir / "tiny-model"), "checked against the model sft starts from"
    assert str(final) in grpo.script and str(final) not in sft.script
    # ${trial_name} resolves to each stage's trial: the tensorboard files land in the stage's own directory
    assert sft.config.stats_logger.tensorboard.path == str(sft.paths.root / "tensorboard")
    assert grpo.config.stats_logger.tensorboard.path == str(grpo.paths.root / "tensorboard")
    # what the stage does not list comes from the top level; what it lists replaces it key by key
    assert sft.config.actor.optimizer.lr == 3.0e-3 and sft.config.actor.optimizer.weight_decay == 0.0
    assert grpo.config.actor.optimizer.lr == 1.0e-3 and grpo.config.actor.optimizer.lr_scheduler_type == "constant"
    assert (sft.config.cluster.n_nodes, grpo.config.cluster.n_nodes) == (2, 4)
    assert not (demo_dir / "fileroot").exists(), "preparing writes nothing"


def test_a_later_stages_kl_reference_follows_its_start_or_is_the_model_it_names(demo_dir: Path,
                                                                                 tmp_path: Path) -> None:
    """AReaL's `ref.path: ${actor.path}` at the top level means the actor's start: in the grpo stage that is sft's
    final model, not the model sft started from. A stage naming sft's final model itself is checked, before sft
    ran, against the model sft starts from (as actor.path is)."""
    from rlkit.config.reference import reference_path

    data = yaml.safe_load(DEMO.read_text())
    data["ref"] = {"path": "${actor.path}"}
    data["stages"][1]["actor"]["kl_ctl"] = 0.1
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(data))
    plans, _ = prepare_stages(path, [])
    sft, grpo = (p.prepared for p in plans)
    final = str(sft.paths.root / "checkpoints" / "final")
    assert sft.config.ref.path == str(demo_dir / "tiny-model")
    assert grpo.config.ref.path == "" and reference_path(grpo.config) == final
    data["stages"][1]["ref"] = {"path": final}
    path.write_text(yaml.safe_dump(data))
    plans, _ = prepare_stages(path, [])
    assert plans[1].prepared.config.ref.path == final


def test_overrides_reach_every_stage_or_the_one_they_name(demo_dir: Path) -> None:
    plans = prepare_stages(DEMO, ["seed=7", "stages.grpo.actor.optimizer.lr=5e-4", "trial_name=try2"])[0]
    sft, grpo = (p.prepared.config for p in plans)
    assert (sft.seed, grpo.seed) == (7, 7)
    assert (sft.actor.optimizer.lr, grpo.actor.optimizer.lr) == (3.0e-3, 5e-4)
    assert (sft.trial_name, grpo.trial_name) == ("try2_sft", "try2_grpo")


def test_a_shared_knob_reaches_the_stages_that_read_it_and_a_stages_own_unread_knob_is_refused(
        demo_dir: Path, tmp_path: Path) -> None:
    """The top level and the common overrides are every stage's: a knob of the grpo stage written there is left out
    of the sft stage, which does not read it (rlkit.launch.stage_knobs); written for the sft stage itself, or read by
    no stage of the run, it is refused (rlkit.checks.unread_knobs)."""
    data = yaml.safe_load(DEMO.read_text())
    path = _with_stages(tmp_path, {"gconfig": {"top_p": 0.9, "n_samples": 8},
                                   "actor": {**data["actor"], "entropy_coeff": 0.01}})
    plans = prepare_stages(path, ["actor.kl_ctl=0.01"])[0]
    sft, grpo = (p.prepared.config for p in plans)
    assert (sft.gconfig.top_p, sft.actor.entropy_coeff, sft.actor.kl_ctl) == (1.0, 0.0, 0.0)
    assert (sft.gconfig.n_samples, sft.actor.group_size) == (1, 1)  # the group size follows the samples it took
    assert (grpo.gconfig.top_p, grpo.actor.entropy_coeff, grpo.actor.kl_ctl) == (0.9, 0.01, 0.01)
    said = _problems(DEMO, ["stages.sft.actor.eps_clip=0.1", "critic.eps_clip=0.3"])
    assert "stage sft: actor.eps_clip is set, but job type sft has no PPO clipped loss (that of grpo, ppo, " \
           "distill): it would be ignored" in said
    for stage in ("sft", "grpo"):
        assert f"stage {stage}: critic.eps_clip is set, but critic.* is read by job type ppo only, not {stage}: it " \
               "would be ignored" in said


def test_a_shared_knob_one_stage_reads_under_its_settings_is_left_out_of_a_stage_where_it_is_off(
        demo_dir: Path) -> None:
    """The sft section is the sft stage's own; a grpo stage reads it only for an SFT+RL mix's rows
    (rlkit.checks.conditional_knobs): without expert_dataset it is taken out there, not refused. LoRA's rank,
    read by neither stage (use_lora off in both), is refused for both."""
    plans = prepare_stages(DEMO, ["sft.system_prompt=Answer."])[0]
    sft, grpo = (p.prepared.config for p in plans)
    assert (sft.sft.system_prompt, grpo.sft.system_prompt) == ("Answer.", "")
    said = _problems(DEMO, ["actor.lora_rank=8"])
    assert said == ["stages sft, grpo: actor.lora_rank is set, but actor.use_lora is false (no LoRA adapters are "
                    "trained): it would be ignored"], said


def test_a_stage_with_its_own_model_keeps_it_and_a_reward_model_is_not_passed_on_as_a_policy(
        demo_dir: Path, tmp_path: Path) -> None:
    plans = prepare_stages(DEMO, [f"stages.grpo.actor.path={demo_dir / 'tiny-model'}"])[0]
    assert plans[1].prepared.config.actor.path == str(demo_dir / "tiny-model")
    assert plans[1].record.model_stand_in == ""
    data = yaml.safe_load(DEMO.read_text())
    sft, grpo = data["stages"]
    rw = {"stage_name": "rm", "type": "rw", "allocation_mode": "fsdp:d2", "cluster": {"n_nodes": 2},
          "train_dataset": {"path": str(_pairs(tmp_path)), "type": "pairs", "batch_size": 4}}
    path = _with_stages(tmp_path, {"stages": [sft, rw, grpo]})
    plans = prepare_stages(path, [])[0]
    sft_final = str(plans[0].prepared.paths.checkpoints / "final")
    assert plans[1].prepared.config.actor.path == sft_final, "rw starts from the sft model"
    assert plans[2].prepared.config.actor.path == sft_final, "grpo too: rw's final is a value model, not a policy"


def _pairs(tmp_path: Path) -> Path:
    import json

    path = tmp_path / "pairs.jsonl"
    rows = [{"prompt": f"Q: {i}+1= A:", "chosen": f" {i + 1}", "rejected": " x"} for i in range(8)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_every_problem_of_every_stage_is_reported_at_once(demo_dir: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(DEMO.read_text())
    sft, grpo = data["stages"]
    generate = {"stage_name": "gen", "type": "generate", "allocation_mode": "vllm:d1"}
    path = _with_stages(tmp_path, {
        "seed": "not-a-number",  # a top-level mistake: every stage's, reported once naming them all
        "stages": [{**sft, "trial_name": "x"}, {**grpo, "actor": {**grpo["actor"], "eps_clipp": 0.1}},
                   {"type": "sft"}, {**grpo, "stage_name": "sft"}, generate, "grpo"]})
    messages = _problems(path, ["stages.nope.seed=1"])
    joined = "\n".join(messages)
    assert "stage sft sets trial_name, which only the top level may set" in joined
    assert "stages[2] has no stage_name" in joined
    assert "two stages are named sft" in joined
    assert "stages[5] is a str, not a mapping" in joined
    assert "override 'stages.nope.seed=1' names no stage of this run" in joined
    assert "stage gen is a generate job, which trains nothing to pass on" in joined
    assert any(m.startswith("stages sft, grpo: wrong type for 'seed'") for m in messages), joined
    assert not (demo_dir / "fileroot").exists()


def test_a_stage_that_trains_nothing_and_a_stage_error_are_each_named(demo_dir: Path, tmp_path: Path) -> None:
    data = yaml.safe_load(DEMO.read_text())
    sft, grpo = data["stages"]
    path = _with_stages(tmp_path, {"stages": [sft, {**grpo, "actor": {**grpo["actor"], "eps_clipp": 0.1}}]})
    messages = _problems(path)
    assert any(m.startswith("stage grpo: unknown key 'actor.eps_clipp'") for m in messages), messages
    assert _problems(_with_stages(tmp_path, {"stages": []})) == [
        "stages must be a list of stages, each a mapping with its stage_name"]


def _stage_names(plans: list[StagePlan]) -> list[str]:
    return [p.record.name for p in plans]


def test_stage_trial_configs_are_ordinary_configs(demo_dir: Path, tmp_path: Path) -> None:
    """What a stage's trial records (config.yaml) loads back as a plain config, so `rlkit resume`, `logs` and `stop`
    treat a stage as any trial."""
    from rlkit.config.load import to_yaml

    plans = prepare_stages(DEMO, [])[0]
    assert _stage_names(plans) == ["sft", "grpo"]
    for plan in plans:
        path = tmp_path / f"{plan.record.name}.yaml"
        path.write_text(to_yaml(plan.prepared.config))
        assert load_config(path) == plan.prepared.config


def test_a_later_stage_cannot_be_resumed_before_the_model_it_starts_from_exists(
        demo_dir: Path, rlkit_home: Path) -> None:
    """`rlkit resume RUN_grpo` alone, while the sft stage has no final model: refused with the run's resume as the
    fix (before asking Slurm anything); once the sft stage's final exists, the stage is a trial like any other."""
    from rlkit.config.load import to_yaml
    from rlkit.launch.resume import _stage_stand_ins, resume_trial
    from rlkit.trials.records import TrialRecord, record_trial
    from rlkit.trials.stage_runs import StagedRun, record_run

    plans = prepare_stages(DEMO, [])[0]
    for plan in plans:
        plan.prepared.paths.root.mkdir(parents=True)
        plan.prepared.paths.config.write_text(to_yaml(plan.prepared.config))
        record_trial(TrialRecord("demo-stages", plan.record.trial, str(plan.prepared.paths.root), "1", 0.0))
    record_run(StagedRun("demo-stages", "run1", tuple(p.record for p in plans), 0.0))
    with pytest.raises(UserError) as caught:
        resume_trial("demo-stages/run1_grpo", [])
    assert "stage sft has not written the model it starts from" in caught.value.message
    assert caught.value.hint is not None and "rlkit resume demo-stages/run1" in caught.value.hint
    (plans[0].prepared.paths.checkpoints / "final").mkdir(parents=True)
    assert _stage_stand_ins(str(plans[1].prepared.paths.root)) == (str(demo_dir / "tiny-model"), "")
    assert _stage_stand_ins(str(demo_dir / "elsewhere")) == ("", "")
