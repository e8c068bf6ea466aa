"""A knob the job type never reads is refused at submit (rlkit.checks.unread_knobs), one problem per field naming
it, the job type and the fix; what the job type reads is accepted. Through `rlkit render`'s own path
(rlkit.launch.submit.prepare), and once through the CLI itself (exit 2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlkit.checks.unread_knobs import ACTOR_ELSEWHERE, ACTOR_KNOBS
from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.walk import field_names
from rlkit.errors import ConfigError
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit


@pytest.fixture
def sft_yaml(tmp_path: Path, fake_model: Path) -> Path:
    """A valid sft config (container_type none) with its rows, under tmp_path."""
    (fake_model / "tokenizer.json").write_text("{}")
    rows = tmp_path / "sft.jsonl"
    rows.write_text(json.dumps({"prompt": "Q: 1+2= A:", "response": " 3"}) + "\n")
    path = tmp_path / "sft.yaml"
    path.write_text(yaml.safe_dump({
        "experiment_name": "test-exp", "trial_name": "t1", "type": "sft", "allocation_mode": "fsdp:d2",
        "actor": {"path": str(fake_model)}, "sft": {"apply_chat_template": False},
        "cluster": {"fileroot": str(tmp_path / "fileroot"), "n_nodes": 2, "n_gpus_per_node": 1},
        "launcher": {"trainer_cpus_per_gpu": 1, "trainer_mem_per_gpu": 1000, "python": "/opt/py/bin/python",
                     "slurm": {"container_type": "none"}},
        "train_dataset": {"path": str(rows), "type": "sft", "batch_size": 2}}))
    return path


def refusal(path: Path, overrides: list[str]) -> str:
    """Every problem `rlkit render` reports for the config, with their fixes."""
    with pytest.raises(ConfigError) as info:
        prepare(path, overrides, dry_run=True)
    return str(info.value)


def test_the_critic_section_is_refused_by_every_job_type_but_ppo(grpo_yaml: Path, sft_yaml: Path) -> None:
    said = refusal(grpo_yaml, ["critic.optimizer.lr=1e-6", "critic.eps_clip=0.3"])
    for field in ("critic.optimizer.lr", "critic.eps_clip"):
        assert f"{field} is set, but critic.* is read by job type ppo only, not grpo: it would be ignored" in said
        assert f"fix: remove {field}" in said
    assert "critic.* is read by job type ppo only, not sft" in refusal(sft_yaml, ["critic.dtype=float32"])
    # the critic's own defaults (its optimizer's lr 1e-5, not the actor's 2e-5) are no setting
    prepare(grpo_yaml, ["critic.optimizer.lr=1e-5"], dry_run=True)
    prepare(grpo_yaml, ["type=ppo", "critic.optimizer.lr=1e-6", "critic.eps_clip=0.3"], dry_run=True)


def test_the_cli_exits_2_naming_the_critic_knob_of_a_grpo_job(grpo_yaml: Path, rlkit_home: Path) -> None:
    result = run_rlkit("render", str(grpo_yaml), "critic.optimizer.lr=1e-6", env={"RLKIT_HOME": str(rlkit_home)})
    assert result.returncode == 2, result.stderr
    assert "critic.optimizer.lr is set, but critic.* is read by job type ppo only, not grpo" in result.stderr
    assert "Traceback" not in result.stderr and "#SBATCH" not in result.stdout


def test_the_ppo_knobs_of_a_job_without_a_policy_loss_are_refused(sft_yaml: Path) -> None:
    """sft trains no policy on rollouts: PPO's clip, the actor update's passes and the rollouts' reward shaping
    would all be ignored, each named with the part it belongs to."""
    groups = {"PPO clipped loss (that of grpo, ppo, distill)": ["actor.eps_clip=0.1", "actor.c_clip=3",
                                                               "actor.rejection_sampling.upper=4"],
              "PPO actor update (that of grpo, ppo, opmd, distill)": [
                  "actor.ppo_n_minibatches=2", "actor.use_decoupled_loss=true", "actor.recompute_logprob=false",
                  "actor.kl_loss_coef=0.1"],
              "rewards and advantages of rollouts (that of grpo, ppo, opmd, distill)": [
                  "actor.kl_ctl=0.1", "actor.group_size=4", "actor.reward_norm.mean_level=group",
                  "actor.adv_norm.std_level=batch", "actor.dynamic_sampling=true", "actor.discount=0.9"],
              "weight pushes to rollout servers (that of grpo, ppo, opmd, distill)": [
                  "actor.weight_update_mode=xccl", "actor.weight_update_interval=2", "async_training=false"]}
    said = refusal(sft_yaml, [o for overrides in groups.values() for o in overrides])
    for what, overrides in groups.items():
        for override in overrides:
            field = override.split("=")[0].removesuffix(".upper").removesuffix(".mean_level").removesuffix(
                ".std_level")
            assert f"{field} is set, but job type sft has no {what}: it would be ignored" in said, field
            assert f"fix: remove {field}" in said


def test_the_trainer_knobs_of_a_generate_job_are_refused(generate_yaml: Path) -> None:
    said = refusal(generate_yaml, ["actor.optimizer.lr=1e-6", "actor.mb_spec.n_mbs=2", "total_train_steps=10"])
    for field in ("actor.optimizer.lr", "actor.mb_spec.n_mbs", "total_train_steps"):
        assert f"{field} is set, but job type generate has no trainer (that of grpo, ppo, opmd, sft, rw, dpo, " \
               "distill)" in said
    prepare(generate_yaml, ["actor.path=" + yaml.safe_load(generate_yaml.read_text())["actor"]["path"]],
            dry_run=True)  # its servers' model: read


def test_the_sections_of_other_job_types_are_refused(grpo_yaml: Path, sft_yaml: Path) -> None:
    said = refusal(grpo_yaml, ["distill.coef=0.5", "dpo.beta=0.2", "rw.chosen_key=good", "opmd.tau=2",
                               "generate.max_prompts=3"])
    for field, readers in (("distill.coef", "job type distill only"), ("dpo.beta", "job type dpo only"),
                           ("rw.chosen_key", "job type rw only"), ("opmd.tau", "job type opmd only"),
                           ("generate.max_prompts", "job type generate only")):
        assert f"{field} is set, but {field.split('.')[0]}.* is read by {readers}, not grpo" in said
    said = refusal(sft_yaml, ["gconfig.n_samples=4", "rollout.max_concurrent_rollouts=8",
                              "reward.fn=exact_match", "eval_gconfig.temperature=0.5", "mix.mu=0.5"])
    for field in ("gconfig.n_samples", "rollout.max_concurrent_rollouts", "reward.fn", "eval_gconfig.temperature",
                  "mix.mu"):
        assert f"{field} is set, but {field.split('.')[0]}.* is read by job types " in said
    assert "actor.group_size" not in said  # it follows gconfig.n_samples unless set: the one mistake, said once


def test_opmd_refuses_the_clip_knobs_and_reads_the_actor_update(grpo_yaml: Path) -> None:
    said = refusal(grpo_yaml, ["type=opmd", "actor.eps_clip=0.1", "actor.importance_sampling_level=sequence"])
    for field in ("actor.eps_clip", "actor.importance_sampling_level"):
        assert f"{field} is set, but job type opmd has no PPO clipped loss (that of grpo, ppo, distill)" in said
    prepare(grpo_yaml, ["type=opmd", "actor.loss_agg_mode=seq-mean-token-mean", "actor.kl_loss_coef=0.01",
                        "actor.ppo_epochs=2", "opmd.tau=2"], dry_run=True)


def test_every_field_of_the_actor_is_in_one_group_or_judged_elsewhere() -> None:
    """A new actor knob must say what reads it (or it would be accepted by every job type unjudged)."""
    grouped = [f for knobs in ACTOR_KNOBS for f in knobs.fields if f.startswith("actor.")]
    assert len(grouped) == len(set(grouped)), "a field in two groups"
    assert {f.removeprefix("actor.") for f in (*grouped, *ACTOR_ELSEWHERE)} == field_names(ActorConfig)


def test_a_resumed_trial_keeps_what_an_older_rlkit_accepted_with_a_warning(grpo_yaml: Path) -> None:
    """A trial submitted before this check with a knob its job type ignores resumes (attempt > 1): the knob is said
    as a warning and stays ignored, while another problem of the same config is still refused."""
    knob = ["critic.optimizer.lr=1e-6"]
    assert "critic.optimizer.lr is set" in refusal(grpo_yaml, knob)  # a new submission: refused
    resumed = prepare(grpo_yaml, knob, attempt=2, dry_run=True)
    said = [str(w) for w in resumed.warnings]
    assert any("critic.optimizer.lr is set, but critic.* is read by job type ppo only" in w for w in said), said
    with pytest.raises(ConfigError) as info:
        prepare(grpo_yaml, [*knob, "actor.ppo_n_minibatches=7"], attempt=2, dry_run=True)
    assert "ppo_n_minibatches=7" in str(info.value) and "critic.optimizer.lr" not in str(info.value)


def test_a_knob_the_resume_command_line_gives_is_refused_not_kept(grpo_yaml: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """What `rlkit resume` keeps with a warning is the recorded config's (an older rlkit accepted it); a knob the
    job type never reads given on the resume's own command line is new input, refused as at submit (exit 2), not
    warned as 'recorded with it'."""
    from rlkit.launch import resume as resume_mod
    from rlkit.launch.resume import resume_trial

    def prepared_at_attempt_2(path: Path, overrides: list[str], **kw: object) -> object:
        given = [o for o in overrides if not o.startswith("recover.mode=")]  # no checkpoint here: not the point
        return prepare(grpo_yaml, ["critic.optimizer.lr=1e-6", *given], attempt=2, dry_run=True)

    record = type("Record", (), {"trial_dir": str(tmp_path), "job_id": "1", "experiment": "e", "trial": "t",
                                 "name": "e/t"})()
    (tmp_path / "config.yaml").write_text("{}")
    monkeypatch.setattr(resume_mod, "find_trial", lambda spec: record)
    monkeypatch.setattr(resume_mod, "_stage_stand_ins", lambda trial_dir: ("", ""))
    monkeypatch.setattr(resume_mod.slurm, "job_info", lambda job: None)
    monkeypatch.setattr(resume_mod.slurm, "is_trials_active_job", lambda *a: False)
    monkeypatch.setattr(resume_mod, "prepare", prepared_at_attempt_2)
    monkeypatch.setattr(resume_mod, "submit", lambda *a, **kw: (_ for _ in ()).throw(AssertionError("submitted")))
    with pytest.raises(ConfigError) as info:
        resume_trial("e/t", ["critic.eps_clip=0.3"])
    assert "critic.eps_clip is set, but critic.* is read by job type ppo only" in str(info.value)
    assert "critic.optimizer.lr" not in str(info.value)  # the recorded one stays a warning
