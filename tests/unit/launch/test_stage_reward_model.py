"""The reward model of a multi-stage run (rlkit.launch.stage_reward): an rw stage's checkpoints/final handed over as
reward.reward_model_path (and a ppo stage's critic.path) of the later stages that score with `reward_model`, checked
before it exists against the model rw trains from; a stage needing one that no stage trains is refused. The real
path on Slurm: tests/integration/test_stage_reward_model_e2e.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkit.errors import ConfigError, UserError, each_error
from rlkit.launch.stages import StagePlan, handed_over, prepare_stages
from tests.conftest import CONFIGS

DEMO = CONFIGS / "sft-grpo-cpu-demo.yaml"
DIGITS = "rlkit.tasks.digits:digits_reward"


@pytest.fixture
def demo_dir(tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """What the demo config reads, plus preference pairs for an rw stage; fileroot in tmp."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_sft import write_sft_dataset

    (tmp_path / "tiny-model").symlink_to(tiny_model_dir)
    write_sft_dataset(tmp_path)
    write_dataset(tmp_path / "digits.jsonl")
    rows = [{"prompt": f"Q: {i}+1= A:", "chosen": f" {i + 1}", "rejected": " x"} for i in range(8)]
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    monkeypatch.setenv("RLKIT_DEMO_DIR", str(tmp_path))
    monkeypatch.setenv("RLKIT_FILEROOT", str(tmp_path / "fileroot"))
    monkeypatch.delenv("RLKIT_DEMO_TRIAL", raising=False)
    return tmp_path


def _config(tmp_path: Path, *, rl_type: str = "ppo", reward: dict[str, Any] | None = None, rw: bool = True,
            rl_extra: dict[str, Any] | None = None) -> Path:
    """The demo's sft and grpo stages with an rw stage between them (`rw`), the last one of `rl_type` scoring
    with `reward` (default: reward.fn reward_model)."""
    data = yaml.safe_load(DEMO.read_text())
    sft, rl = data["stages"]
    rl = {**rl, "stage_name": "rl", "type": rl_type, "reward": reward or {"fn": "reward_model", "num_workers": 1},
          **(rl_extra or {})}
    rm = {"stage_name": "rm", "type": "rw", "allocation_mode": "fsdp:d2", "cluster": {"n_nodes": 2},
          "rw": {"chosen_key": "chosen", "rejected_key": "rejected"},
          "train_dataset": {"path": str(tmp_path / "pairs.jsonl"), "type": "rw", "batch_size": 4, "max_length": 64}}
    data["stages"] = [sft, rm, rl] if rw else [sft, rl]
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(data))
    return path



def _resume_after_sft(plans: list[StagePlan], name: str, demo_dir: Path) -> None:
    """sft's final model written, `rlkit resume RUN`: rm and rl are submitted again (sft is done)."""
    from rlkit.launch.stages import resume_run
    from rlkit.trials.stage_runs import find_run

    plans[0].prepared.paths.checkpoints.mkdir(parents=True)
    (plans[0].prepared.paths.checkpoints / "final").symlink_to(demo_dir / "tiny-model")  # sft's model, written
    found = find_run(name)
    assert found is not None
    resumed = resume_run(found, [])
    assert [(stage.name, how) for stage, _, how in resumed] == [("rm", "again"), ("rl", "again")]

def _final(plan: StagePlan) -> str:
    return str(plan.prepared.paths.checkpoints / "final")


def _submitted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[list[StagePlan], Any]:
    """The sft, rm and rl stages prepared and submitted, Slurm faked (the controller's answers are not what the resume
    tests are about: every job CANCELLED)."""
    from rlkit.config.problems import Problems
    from rlkit.launch import slurm
    from rlkit.launch.stages import submit_stages

    jobs = iter(range(100, 200))
    monkeypatch.setattr(slurm, "sbatch_test_only", lambda script: "ok")
    monkeypatch.setattr(slurm, "sbatch", lambda path, after_ok="": str(next(jobs)))
    monkeypatch.setattr("rlkit.launch.submit.site_preflight", lambda plan, **kw: Problems())
    monkeypatch.setattr(slurm, "job_info", lambda job: slurm.JobInfo(job, "CANCELLED"))
    plans, _ = prepare_stages(_config(tmp_path), [])
    return plans, submit_stages(plans)


def _problems(path: Path, overrides: list[str] | None = None) -> list[ConfigError]:
    with pytest.raises(ConfigError) as caught:
        prepare_stages(path, overrides or [])
    return [e for e in each_error(caught.value) if isinstance(e, ConfigError)]


def test_the_rw_stages_final_is_the_later_stages_reward_model_and_its_critic(demo_dir: Path, tmp_path: Path) -> None:
    """sft -> rw -> ppo, InstructGPT's pipeline: ppo starts from sft's final, scores with rw's final and starts its
    critic from it (OpenRLHF's default); before rw ran, both are checked against the model rw starts from, whose own
    checks read the model sft starts from."""
    plans, warnings = prepare_stages(_config(tmp_path), [])
    assert warnings == []
    sft, rm, rl = plans
    assert [(p.record.name, p.record.type) for p in plans] == [("sft", "sft"), ("rm", "rw"), ("rl", "ppo")]
    config = rl.prepared.config
    assert config.actor.path == _final(sft) and rm.prepared.config.actor.path == _final(sft)
    assert config.reward.reward_model_path == _final(rm)
    assert config.critic.path == _final(rm), "the critic starts from the reward model"
    assert rl.record.reward_stand_in == str(demo_dir / "tiny-model") and rl.record.stand_ins
    assert rm.record.reward_stand_in == "" and sft.record.reward_stand_in == ""
    assert handed_over(rl) == [("actor.path", _final(sft)), ("reward.reward_model_path", _final(rm)),
                               ("critic.path", _final(rm))]
    assert handed_over(rm) == [("actor.path", _final(sft))] and handed_over(sft) == []
    assert not (demo_dir / "fileroot").exists(), "preparing writes nothing"


def _to_yaml(plan: StagePlan) -> str:
    from rlkit.config.load import to_yaml

    return to_yaml(plan.prepared.config)


def test_grpo_gets_the_reward_model_and_has_no_critic_to_hand_it_to(demo_dir: Path, tmp_path: Path) -> None:
    plans, _ = prepare_stages(_config(tmp_path, rl_type="grpo"), [])
    assert plans[2].prepared.config.reward.reward_model_path == _final(plans[1])
    assert plans[2].prepared.config.critic.path == ""


@pytest.mark.parametrize(("fns", "handed"), [({DIGITS: 1.0, "reward_model": 0.5}, True), ({DIGITS: 1.0}, False)])
def test_a_mix_gets_the_reward_model_when_one_of_its_functions_is_reward_model(
        demo_dir: Path, tmp_path: Path, fns: dict[str, float], handed: bool) -> None:
    plans, _ = prepare_stages(_config(tmp_path, rl_type="grpo", reward={"fns": fns, "num_workers": 1}), [])
    rl = plans[2]
    assert rl.prepared.config.reward.reward_model_path == (_final(plans[1]) if handed else "")
    assert rl.record.reward_stand_in == (str(demo_dir / "tiny-model") if handed else "")


def _reward_model_dir(path: Path, tiny_model_dir: Path) -> Path:
    """What rw writes, as far as the submit-time checks read it: config.json, the value-head note, a tokenizer."""
    from rlkit.config.model_config import VALUE_HEAD_NOTE

    path.mkdir()
    (path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    (path / VALUE_HEAD_NOTE).write_text(json.dumps({"kind": "reward"}))
    (path / "tokenizer.json").write_text((tiny_model_dir / "tokenizer.json").read_text())
    return path


def test_a_stage_naming_its_own_reward_model_keeps_it_and_its_critic(demo_dir: Path, tmp_path: Path,
                                                                     tiny_model_dir: Path) -> None:
    own = _reward_model_dir(tmp_path / "my-rm", tiny_model_dir)
    path = _config(tmp_path, rl_extra={"reward": {"fn": "reward_model", "reward_model_path": str(own)}})
    plans, _ = prepare_stages(path, [])
    assert plans[2].prepared.config.reward.reward_model_path == str(own)
    assert plans[2].prepared.config.critic.path == "" and plans[2].record.reward_stand_in == ""
    plans, _ = prepare_stages(_config(tmp_path), [f"stages.rl.critic.path={tiny_model_dir}"])
    assert plans[2].prepared.config.critic.path == str(tiny_model_dir), "a critic.path of its own is kept"
    assert plans[2].prepared.config.reward.reward_model_path == _final(plans[1])
    sft_final = str(demo_dir / "fileroot" / "demo-stages" / "run1_sft" / "checkpoints" / "final")
    plans, _ = prepare_stages(_config(tmp_path), [f"stages.rl.critic.path={sft_final}"])
    assert plans[2].prepared.config.critic.path == sft_final, "the policy's final, checked before it exists"


def test_a_stage_needing_a_reward_model_nobody_trains_is_refused_naming_the_key_and_the_fix(
        demo_dir: Path, tmp_path: Path, tiny_model_dir: Path) -> None:
    for path in (_config(tmp_path, rw=False),
                 _config(tmp_path, rw=False, reward={"fns": {DIGITS: 1.0, "reward_model": 1.0}})):
        errors = _problems(path)
        mine = [e for e in errors if "no stage before it trains a reward model" in e.message]
        assert len(mine) == 1, [e.message for e in errors]
        assert "stage rl scores with reward_model" in mine[0].message
        assert "reward.reward_model_path is empty" in mine[0].message
        assert mine[0].hint is not None and "add an rw stage before rl" in mine[0].hint
        assert "stages.rl.reward.reward_model_path" in mine[0].hint
    assert not (demo_dir / "fileroot").exists()
    # a path of its own, at the top level or the stage's, is no refusal
    own = _reward_model_dir(tmp_path / "my-rm", tiny_model_dir)
    plans, _ = prepare_stages(_config(tmp_path, rw=False), [f"reward.reward_model_path={own}"])
    assert plans[1].prepared.config.reward.reward_model_path == str(own)


def test_the_run_record_keeps_the_stand_in_and_a_stage_resumed_alone_waits_for_the_rw_stage(
        demo_dir: Path, tmp_path: Path, rlkit_home: Path) -> None:
    """`rlkit resume RUN` re-prepares the later stages from their records: the reward stand-in survives the record;
    the ppo stage resumed on its own before rw wrote its model is refused with the run's resume as the fix."""
    from rlkit.launch.resume import _stage_stand_ins, resume_trial
    from rlkit.trials.records import TrialRecord, record_trial
    from rlkit.trials.stage_runs import StagedRun, find_run, record_run

    plans, _ = prepare_stages(_config(tmp_path), [])
    for plan in plans:
        plan.prepared.paths.root.mkdir(parents=True)
        plan.prepared.paths.config.write_text(_to_yaml(plan))
        record_trial(TrialRecord("demo-stages", plan.record.trial, str(plan.prepared.paths.root), "1", 0.0))
    record_run(StagedRun("demo-stages", "run1", tuple(p.record for p in plans), 0.0))
    run = find_run("demo-stages/run1")
    assert run is not None and run.stage("rl").reward_stand_in == str(demo_dir / "tiny-model")
    (plans[0].prepared.paths.checkpoints / "final").mkdir(parents=True)  # sft done, rw not
    with pytest.raises(UserError) as caught:
        resume_trial("demo-stages/run1_rl", [])
    assert "stage rm has not written the model it starts from" in caught.value.message
    (plans[1].prepared.paths.checkpoints / "final").mkdir(parents=True)
    assert _stage_stand_ins(str(plans[2].prepared.paths.root)) == (str(demo_dir / "tiny-model"),) * 2


def test_resuming_the_run_before_the_rw_stage_finished_submits_the_later_stages_with_the_reward_model(
        demo_dir: Path, tmp_path: Path, rlkit_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlkit resume RUN` with sft done and rm not: rm and rl are submitted again, rl still scoring with (and its
    critic starting from) rm's final, which its re-checks read as the recorded stand-in (Slurm faked: the
    controller's answers are not what this is about)."""
    from rlkit.config.load import load_config

    plans, run = _submitted_run(tmp_path, monkeypatch)
    _resume_after_sft(plans, run.name, demo_dir)
    config = load_config(plans[2].prepared.paths.config)
    assert config.reward.reward_model_path == _final(plans[1]) == config.critic.path


def test_a_resumed_stage_checks_a_reward_model_or_actor_path_an_override_names_as_it_is(
        demo_dir: Path, tmp_path: Path, rlkit_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The recorded stand-ins stand for the finals handed over at submit only: `rlkit resume RUN
    stages.rl.reward.reward_model_path=/typo` (or actor.path) is refused for that path, not checked as rm's model."""
    from rlkit.launch.stages import resume_run
    from rlkit.trials.stage_runs import find_run

    _, run = _submitted_run(tmp_path, monkeypatch)
    found = find_run(run.name)
    assert found is not None
    for key in ("reward.reward_model_path", "actor.path"):
        typo = str(tmp_path / "no-such-model")
        with pytest.raises(ConfigError) as caught:
            resume_run(found, [f"stages.rl.{key}={typo}"])
        messages = [e.message for e in each_error(caught.value) if isinstance(e, ConfigError)]
        assert any(typo in m for m in messages), (key, messages)


def test_resuming_a_run_keeps_a_knob_a_recorded_stage_never_reads_with_a_warning(
        demo_dir: Path, tmp_path: Path, rlkit_home: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A run an older rlkit recorded may hold, in a stage's config, a knob that stage's job type never reads (the
    run file's shared `critic.*` reached the rw stage too): `rlkit resume RUN` submits that stage again from its
    record, saying the knob as a warning (ConfigError.recorded_ok), as `rlkit resume TRIAL` does, not refusing it."""

    plans, run = _submitted_run(tmp_path, monkeypatch)
    rm_config = plans[1].prepared.paths.config
    recorded = yaml.safe_load(rm_config.read_text())
    recorded["critic"] = {**recorded.get("critic", {}), "optimizer": {"lr": 1e-6}}  # what an older rlkit kept
    rm_config.write_text(yaml.safe_dump(recorded))
    _resume_after_sft(plans, run.name, demo_dir)
    said = capsys.readouterr().err
    assert "stage rm: critic.optimizer.lr is set, but critic.* is read by job type ppo only" in said, said
