"""AReaL's keys rlkit lacks: the table covers AReaL's reference, accepted keys are named once with the reason, keys
that would change training are refused unless their value is what rlkit does, and a missing `type` is an error
unless the config can only be a generate job."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.areal.accept import AcceptedKey, notice_lines, rule_for
from rlkit.config.areal.keys import RENAMED_SECTIONS, TABLES
from rlkit.config.areal.names import AREAL_KEYS
from rlkit.config.areal.rules import DERIVED, INERT, SAME
from rlkit.config.load import compose, typed_config
from rlkit.config.model_config import dropout_free
from rlkit.config.problems import Problems
from rlkit.config.schema.walk import schema_paths
from rlkit.jobs import REGISTRY
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import AREAL_KEYS_FIELD, read_manifest, write_manifest


def _areal_paths() -> list[str]:
    return [f"{section}.{key}" if section else key for section, keys in AREAL_KEYS.items() for key in keys.split()]


def test_every_areal_key_is_in_the_schema_or_the_table() -> None:
    """A key of AReaL's reference is either a field of rlkit or has a rule: none falls through to 'unknown key'."""
    ours = set(schema_paths())
    missing = [path for path in _areal_paths()
               if path not in ours and rule_for(path) is None and path not in RENAMED_SECTIONS]
    assert not missing, missing


def test_no_table_entry_shadows_a_schema_field() -> None:
    """A key the schema has (say, once a feature lands) must leave the table: the schema wins, the rule is dead."""
    ours = set(schema_paths())
    dead = [f"{section}.{key}".lstrip(".") for section, table in TABLES.items() for key in table
            if f"{section}.{key}".lstrip(".") in ours]
    assert not dead, dead


def _compose(data: dict[str, Any], overrides: list[str] | None = None, *, require_type: bool = False
             ) -> tuple[Problems, list[AcceptedKey], Any]:
    problems = Problems()
    accepted: list[AcceptedKey] = []
    cfg = compose(data, list(overrides or []), source="test.yaml", problems=problems, accepted=accepted,
                  job_types=REGISTRY, require_type=require_type)
    return problems, accepted, typed_config(cfg) if cfg is not None and problems.ok() else None


def _grpo(model: Path, **sections: Any) -> dict[str, Any]:
    """An AReaL-style GRPO mapping with rlkit's required fields."""
    data: dict[str, Any] = {
        "experiment_name": "gsm8k-grpo", "trial_name": "trial0", "type": "grpo",
        "allocation_mode": "vllm:d1+fsdp:d1", "tokenizer_path": "${actor.path}",
        "cluster": {"fileroot": "/tmp/areal/experiments"},
        "gconfig": {"n_samples": 4, "temperature": 1.0, "ignore_eos": False, "use_beam_search": False,
                    "greedy": False},
        "actor": {"path": str(model), "experiment_name": "${experiment_name}", "trial_name": "${trial_name}",
                  "temperature": "${gconfig.temperature}", "disable_dropout": True, "init_from_scratch": False,
                  "max_new_tokens": "${gconfig.max_new_tokens}", "scheduling_spec": [{"gpu": 1, "cmd": "x"}]},
        "ref": {"experiment_name": "${experiment_name}", "path": "${actor.path}", "dtype": "${actor.dtype}",
                "optimizer": None, "scheduling_spec": "${actor.scheduling_spec}"},
        "rollout": {"experiment_name": "${experiment_name}", "fileroot": "${cluster.fileroot}",
                    "tokenizer_path": "${tokenizer_path}", "enable_rollout_tracing": False, "dump_to_file": True},
        "train_dataset": {"path": "/data/train.jsonl", "pin_memory": True, "num_workers": 4, "drop_last": True},
        "saver": {"experiment_name": "${experiment_name}", "fileroot": "${cluster.fileroot}", "freq_epochs": 1},
        "scheduler": {"type": None},
        "perf_tracer": {"experiment_name": "${experiment_name}", "enabled": False,
                        "session_tracer": {"enabled": False}},
        "enable_offload": False,
    }
    for name, values in sections.items():
        data.setdefault(name, {}).update(values) if isinstance(values, dict) else data.__setitem__(name, values)
    return data


@pytest.fixture
def model(tmp_path: Path) -> Path:
    """A model directory whose config.json has no active dropout (as Qwen2's)."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"attention_dropout": 0.0, "hidden_size": 8}))
    return directory


def test_an_areal_grpo_config_loads_with_each_unused_key_named_once(model: Path) -> None:
    problems, accepted, config = _compose(_grpo(model))
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config is not None and config.type == "grpo"
    kinds = {a.key: a.kind for a in accepted}
    assert len(kinds) == len(accepted), "each key once"
    assert kinds["actor.experiment_name"] == kinds["rollout.fileroot"] == kinds["rollout.tokenizer_path"] == DERIVED
    assert kinds["train_dataset.num_workers"] == kinds["scheduler"] == kinds["actor.scheduling_spec"] == INERT
    assert kinds["perf_tracer.session_tracer.enabled"] == SAME
    assert "ref.path" not in kinds and config.ref.path == str(model), "a field: honoured, not listed"
    assert "ref.dtype" not in kinds and config.ref.dtype == config.actor.dtype, "a field: honoured, not listed"
    assert kinds["gconfig.ignore_eos"] == kinds["gconfig.use_beam_search"] == kinds["actor.temperature"] == SAME
    assert "gconfig.greedy" not in kinds and config.gconfig.greedy is False, "a field: honoured, not listed"
    assert "actor.disable_dropout" not in kinds and config.actor.disable_dropout, "a field: honoured, not listed"
    values = {a.key: a.value for a in accepted}
    assert values["actor.experiment_name"] == "gsm8k-grpo", "interpolated against rlkit's own value"
    assert values["rollout.tokenizer_path"] == str(model)
    assert values["ref.scheduling_spec"] == [{"gpu": 1, "cmd": "x"}], "an AReaL key may name another one"


def test_min_new_tokens_is_a_field_taken_as_given(model: Path) -> None:
    """AReaL's gconfig.min_new_tokens (and eval_gconfig's) is an rlkit field: any value lands in the config (the
    submit-time checks judge it, rlkit.checks.sampling) and is not listed in the notice."""
    problems, accepted, config = _compose(_grpo(model, gconfig={"min_new_tokens": 8},
                                                eval_gconfig={"min_new_tokens": 2}))
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config is not None and (config.gconfig.min_new_tokens, config.eval_gconfig.min_new_tokens) == (8, 2)
    assert not any("min_new_tokens" in a.key for a in accepted)


def test_sapo_and_m2po_keys_are_fields_taken_as_given(model: Path) -> None:
    """AReaL's SAPO and M2PO keys (once refused as changing training) land in rlkit's actor as given."""
    problems, accepted, config = _compose(_grpo(model, actor={
        "use_sapo_loss": True, "sapo_tau_pos": 1.0, "sapo_tau_neg": 1.05, "m2_threshold": 0.04}))
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config is not None
    actor = config.actor
    assert (actor.use_sapo_loss, actor.sapo_tau_pos, actor.sapo_tau_neg, actor.m2_threshold) == (True, 1.0, 1.05, 0.04)
    assert not any("sapo" in a.key or "m2_threshold" in a.key for a in accepted)


@pytest.mark.parametrize(("sections", "says"), [
    ({"rollout": {"experiment_name": "other"}}, "'rollout.experiment_name: other' (in test.yaml): disagrees with "
                                                "rlkit's experiment_name (rlkit: gsm8k-grpo)"),
    ({"saver": {"fileroot": "/elsewhere"}}, "disagrees with rlkit's cluster.fileroot (rlkit: /tmp/areal/experiments)"),
    ({"gconfig": {"ignore_eos": True}}, "'gconfig.ignore_eos: true' (in test.yaml): ignoring EOS is not supported "
                                        "yet"),
    ({"actor": {"temperature": 0.7}}, "'actor.temperature: 0.7' (in test.yaml): not supported yet (rlkit computes "
                                      "log-probs at the sampling temperature"),
    ({"ref": {"init_from_scratch": True}}, "random initialisation is not supported yet"),
    ({"gconfig": {"use_beam_search": True}}, "'gconfig.use_beam_search: true'"),
    ({"train_dataset": {"drop_last": False}}, "'train_dataset.drop_last: false'"),
    ({"sglang": {"max_prefill_tokens": 4096}, "allocation_mode": "sglang:d1+fsdp:d1"},
     "sglang.extra_args: {max_prefill_tokens: <value>}"),
    ({"enable_offload": True}, "training offload (torch_memory_saver) is not supported yet"),
    ({"memory_profiler": {"profile_steps": [1]}}, "the memory profiler is not supported yet"),
])
def test_a_key_that_disagrees_or_would_change_training_is_refused(model: Path, sections: dict[str, Any],
                                                                 says: str) -> None:
    problems, _, _ = _compose(_grpo(model, **sections))
    messages = [str(e) for e in problems.errors]
    assert len(messages) == 1 and says in messages[0], messages


@pytest.mark.parametrize("granularity", [1, 2, 8])
def test_micro_batch_granularity_is_accepted_as_changing_memory_only(model: Path, granularity: int) -> None:
    """rlkit's losses are means over a whole minibatch and a pair is never split, so AReaL's grouping of sequences into
    micro-batches cannot change an update: any value is named in the notice, none refused."""
    problems, accepted, _ = _compose(_grpo(model, actor={"mb_spec": {"granularity": granularity}}))
    assert problems.ok(), [str(e) for e in problems.errors]
    kinds = {a.key: a.kind for a in accepted}
    assert kinds["actor.mb_spec.granularity"] == INERT


def test_a_reference_of_another_model_lands_in_rlkits_ref_section(model: Path) -> None:
    """AReaL's ref.path is rlkit's field (the KL terms' and dpo's reference model): another model than actor.path is
    taken as given (the submit-time checks judge it: rlkit.checks.reference), the section's other keys are
    judged by the table as before."""
    problems, accepted, config = _compose(_grpo(model, actor={"kl_ctl": 0.1}, ref={"path": "/another/model"}))
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config.ref.path == "/another/model" and config.actor.path == str(model)
    kinds = {a.key: a.kind for a in accepted}
    assert "ref.path" not in kinds and "ref.dtype" not in kinds and kinds["ref.scheduling_spec"] == INERT
    assert "path" not in TABLES["ref"], "a field of the schema is no longer looked up in the AReaL table"
    assert "ref" not in TABLES[""], "ref is a section of the schema now"


def test_the_reference_section_of_areals_dpo_config_names_dpos_reference(model: Path) -> None:
    from rlkit.config.reference import reference_field, reference_path

    data = _grpo(model, type="dpo", allocation_mode="fsdp:d1", ref={"path": "/sft/model"})
    del data["gconfig"], data["rollout"]
    problems, _, config = _compose(data)
    assert problems.ok(), [str(e) for e in problems.errors]
    assert (reference_field(config), reference_path(config)) == ("ref.path", "/sft/model")


def test_dropout_is_judged_from_the_models_config(tmp_path: Path, model: Path) -> None:
    with_dropout = tmp_path / "gpt2"
    with_dropout.mkdir()
    (with_dropout / "config.json").write_text(json.dumps({"resid_pdrop": 0.1, "text_config": {"dropout": 0.0}}))
    assert dropout_free(str(model)) is True
    assert dropout_free(str(with_dropout)) is False
    assert dropout_free(str(tmp_path / "absent")) is None and dropout_free("Qwen/Qwen2.5-1.5B") is None
    problems, _, config = _compose(_grpo(with_dropout))
    assert problems.ok() and config.actor.disable_dropout, "the actor's is a field now (rlkit.models.source)"
    ref = {"kl_ctl": 0.1}  # a reference is loaded: its dropout is judged (it runs in eval mode: inert)
    problems, accepted, _ = _compose(_grpo(with_dropout, actor=ref, ref={"disable_dropout": True}))
    assert problems.ok() and "ref.disable_dropout" in {a.key for a in accepted}


def test_unknown_keys_are_all_listed_at_once_with_did_you_mean(model: Path) -> None:
    """Keys in no AReaL version stay errors (in AReaL-only sections too), every one in the same report."""
    problems, _, _ = _compose(_grpo(model, ref={"pathh": "x"}, gconfig={"min_new_token": 0},
                                    perf_tracer={"enabeld": False}))
    messages = [str(e) for e in problems.errors]
    assert any("unknown key 'ref.pathh'" in m and "did you mean 'ref.path'" in m for m in messages), messages
    assert any("unknown key 'perf_tracer.enabeld'" in m and "perf_tracer.enabled" in m for m in messages), messages
    assert any("unknown key 'gconfig.min_new_token'" in m for m in messages), messages
    assert len(messages) == 3


def test_areal_keys_on_the_command_line_are_judged_too(model: Path) -> None:
    problems, accepted, _ = _compose(_grpo(model), ["gconfig.use_beam_search=true", "train_dataset.num_workers=8"])
    assert [("gconfig.use_beam_search: true" in str(e)) for e in problems.errors] == [True]
    assert "in a command-line override" in str(problems.errors[0])
    problems, accepted, _ = _compose(_grpo(model), ["train_dataset.num_workers=8"])
    assert problems.ok() and {a.key: a.value for a in accepted}["train_dataset.num_workers"] == 8


def test_an_older_section_name_beside_the_current_one_is_refused_naming_both(model: Path) -> None:
    """`model:` alone is read as `actor:` (test_areal_examples); given beside `actor:`, which wins is unclear."""
    problems, _, _ = _compose({**_grpo(model), "model": {"path": str(model)}})
    assert [e.hint for e in problems.errors] == ["move the keys of 'model:' into 'actor:'"]


def test_the_notice_names_each_key_with_its_reason() -> None:
    keys = [AcceptedKey("train_dataset.num_workers", 4, INERT, "no DataLoader workers"),
            AcceptedKey("actor.experiment_name", "e", DERIVED, "from experiment_name"),
            AcceptedKey("actor.scheduling_spec", [{"cmd": "python3 -m areal.scheduler.rpc.rpc_server"}], INERT, "x")]
    lines = notice_lines(keys)
    assert lines[0].startswith("3 AReaL key(s) that rlkit has no field for, accepted")
    assert lines[1] == "  actor.experiment_name: e  (rlkit derives it: from experiment_name)"
    assert len(lines[2]) < 120 and "..." in lines[2], "a long value is cut"
    assert notice_lines([]) == []


def test_the_manifest_records_the_accepted_keys_and_a_resume_keeps_them(tmp_path: Path) -> None:
    paths = TrialPaths.of(str(tmp_path), "exp", "t1")
    paths.root.mkdir(parents=True)
    keys = [AcceptedKey("gconfig.use_beam_search", False, SAME, "why").to_dict()]
    write_manifest(paths, job_id="1", images={}, cwd=tmp_path, areal_keys=keys)
    assert read_manifest(paths)[AREAL_KEYS_FIELD] == [{"key": "gconfig.use_beam_search", "value": False,
                                                       "reason": SAME, "detail": "why"}]
    write_manifest(paths, job_id="2", images={}, cwd=tmp_path, kind="resume")
    assert read_manifest(paths)[AREAL_KEYS_FIELD] == keys
    write_manifest(paths, job_id="3", images={}, cwd=tmp_path)
    assert AREAL_KEYS_FIELD not in read_manifest(paths), "a new submit records its own config's keys only"


# ---- the per-engine layout fields (AReaL's current style) ----

def _layout(model: Path, **sections: Any) -> dict[str, Any]:
    data = _grpo(model, **sections)
    del data["allocation_mode"]
    return data


def test_per_engine_backends_give_the_layout(model: Path) -> None:
    data = _layout(model, rollout={"backend": "vllm:d2p1t1"}, actor={"backend": "fsdp:d4p1t1"},
                   ref={"backend": "${actor.backend}"})
    problems, accepted, config = _compose(data)
    assert problems.ok(), [str(e) for e in problems.errors]
    assert config.allocation_mode == "vllm:d2p1t1+fsdp:d4p1t1"
    assert not any(a.key.endswith(".backend") for a in accepted), "read, so not in the notice"


@pytest.mark.parametrize(("sections", "overrides", "says"), [
    ({"rollout": {"backend": "vllm:d2"}, "actor": {"backend": "fsdp:d4"}}, ["allocation_mode=vllm:d2+fsdp:d2"],
     "allocation_mode 'vllm:d2+fsdp:d2' (vllm:d2+fsdp:d2) and rollout.backend 'vllm:d2' and actor.backend 'fsdp:d4' "
     "(vllm:d2+fsdp:d4) give different layouts"),
    ({"rollout": {"backend": "vllm:d2"}, "actor": {"backend": "megatron:d4"}}, [],
     "trainer backend 'megatron' is not supported"),
    ({"rollout": {"backend": "vllm:d2"}, "actor": {"backend": "fsdp:d4"}, "ref": {"backend": "fsdp:d2"}}, [],
     "'ref.backend' is 'fsdp:d2' but actor.backend is 'fsdp:d4'"),
])
def test_layouts_that_disagree_are_refused(model: Path, sections: dict[str, Any], overrides: list[str],
                                           says: str) -> None:
    problems, _, _ = _compose(_layout(model, **sections), overrides)
    messages = [str(e) for e in problems.errors]
    assert any(says in m for m in messages), messages


def test_agreeing_styles_are_fine(model: Path) -> None:
    data = _grpo(model, rollout={"backend": "vllm:d1p1t1"}, actor={"backend": "fsdp:d1p1t1"})
    problems, _, config = _compose(data)
    assert problems.ok() and config.allocation_mode == "vllm:d1+fsdp:d1"


# ---- type ----

def test_a_missing_type_names_the_types_the_config_fits(model: Path) -> None:
    data = _grpo(model)
    del data["type"]
    problems, _, _ = _compose(data, require_type=True)
    assert [e.hint for e in problems.errors] == ["set type=grpo or type=ppo or type=opmd"]
    problems, _, _ = _compose(data, ["type=grpo"], require_type=True)
    assert problems.ok()
    sft = {**data, "train_dataset": {"path": "/d.jsonl", "type": "sft"}, "allocation_mode": "fsdp:d1"}
    problems, accepted, config = _compose(sft, require_type=True)
    assert problems.ok() and config is not None and config.type == "sft", "sft rows leave one choice"
    assert [(a.key, a.value) for a in accepted if a.key == "type"] == [("type", "sft")], "named in the notice"
    problems, _, _ = _compose({**sft, "critic": {"path": "/m"}}, require_type=True)
    assert [e.hint for e in problems.errors] == ["set type=ppo or type=sft"], "a critic disagrees: no guess"


def test_server_flags_of_the_other_backend_are_not_read(model: Path) -> None:
    """AReaL's configs carry both server sections; only the one of the servers in use is judged."""
    problems, accepted, _ = _compose(_grpo(model, sglang={"max_prefill_tokens": 4096, "enable_lora": True}))
    assert problems.ok(), [str(e) for e in problems.errors]
    assert {"sglang.max_prefill_tokens", "sglang.enable_lora"} <= {a.key for a in accepted}


@pytest.mark.parametrize("data", [
    {"allocation_mode": "vllm:d2", "actor": {"path": "/m"}},
    {"allocation_mode": "vllm:d1+fsdp:d1", "generate": {"dataset": {"path": "/d.jsonl"}}, "actor": {"path": "/m"}},
])
def test_an_obvious_generate_job_needs_no_type(data: dict[str, Any]) -> None:
    problems, _, config = _compose({"experiment_name": "e", "trial_name": "t", **data}, require_type=True)
    assert problems.ok() and config.type == "generate"


def test_group_size_left_out_is_the_number_of_samples(model: Path) -> None:
    """AReaL's current configs have no actor.group_size: a group is the completions of one prompt."""
    _, _, config = _compose(_grpo(model))
    assert config is not None and config.actor.group_size == 4
    _, _, config = _compose(_grpo(model), ["gconfig.n_samples=2"])
    assert config is not None and config.actor.group_size == 2
    _, _, config = _compose(_grpo(model, actor={"group_size": 3}))
    assert config is not None and config.actor.group_size == 3, "a given value is kept (validation judges it)"


def test_a_value_given_for_a_section_hides_no_other_problem(model: Path) -> None:
    """`ref: null` (a section rlkit always has) used to stop the check there: the problems behind it came one edit
    later. Now each is listed with it."""
    data = _grpo(model, ref=None, launcher={"slurm": "fast"})
    data["gconfig"]["use_beam_search"] = True
    data["cluster"]["n_node"] = 2
    problems, _, _ = _compose(data, ["stats_logger=off"])
    text = "\n".join(str(e) for e in problems.errors)
    for says in ("'ref' is a section, not a value", "'launcher.slurm' is a section, not a value",
                 "'stats_logger' is a section, not a value (in a command-line override)",
                 "gconfig.use_beam_search: true", "unknown key 'cluster.n_node'"):
        assert text.count(says) == 1, (says, text)
