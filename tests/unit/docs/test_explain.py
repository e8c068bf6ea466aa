"""`rlkit explain KEY` through the real command: a field, a section, a bare name, another system's key, a typo (exit
2 with the closest keys, no traceback), every field and section of the schema, and no heavy import on the way."""

from __future__ import annotations

import subprocess
import sys

import pytest

from rlkit.cli.explain import explain_lines
from rlkit.cli.schema_docs import schema_docs
from rlkit.errors import UserError
from tests.conftest import run_rlkit


def test_a_field_says_its_help_type_default_range_and_other_names() -> None:
    done = run_rlkit("explain", "actor.eps_clip")
    assert done.returncode == 0, done.stderr
    first, *rest = done.stdout.splitlines()
    assert first == "actor.eps_clip  (number, default 0.2, range >= 0)"
    text = "\n".join(rest)
    for says in ("Clip range of the policy ratio", "AReaL: the same name",
                 "verl: actor_rollout_ref.actor.clip_ratio", "cosmos-rl: train.train_policy.epsilon_low",
                 "ChatLearn: models.policy_trainer.neg_clip_ratio", "its section (actor), read by job types: grpo, ppo",
                 "reference: docs/reference/config/actor.md"):
        assert says in text, (says, text)


def test_a_typo_is_an_error_with_the_closest_key() -> None:
    done = run_rlkit("explain", "actor.eps_clp")
    assert done.returncode == 2
    assert "error: unknown config key 'actor.eps_clp'" in done.stderr
    assert "did you mean 'actor.eps_clip'" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_a_bare_name_explains_each_key_of_that_name() -> None:
    lines = explain_lines("mb_spec")
    assert [line.split()[0] for line in lines if line and not line.startswith(" ")] == ["actor.mb_spec",
                                                                                       "critic.mb_spec"]
    many = explain_lines("path")
    assert many[0].endswith("keys are named path; explain one of them:")
    assert any(line.strip().startswith("train_dataset.path") for line in many)


def test_a_section_lists_its_fields() -> None:
    lines = explain_lines("actor.mb_spec")
    assert "  fields:" in lines
    assert any(line.strip().startswith("n_mbs = 1") for line in lines)


def test_another_systems_key_names_rlkits() -> None:
    lines = explain_lines("data.train_batch_size")
    assert lines[0].startswith("verl's data.train_batch_size is rlkit's train_dataset.batch_size")
    assert lines[1].startswith("train_dataset.batch_size  (integer, default 1, range >= 1)")
    assert explain_lines("actor_rollout_ref.ref.fsdp_config.param_offload")[0].startswith(
        "verl's actor_rollout_ref.ref.fsdp_config.param_offload: rlkit has no such key")
    assert explain_lines("actor_rollout_ref.actor.entropy_coeff")[0].startswith(
        "verl's actor_rollout_ref.actor.entropy_coeff is rlkit's actor.entropy_coeff")


def test_a_list_entrys_field_is_found_by_index() -> None:
    assert explain_lines("auxiliary_models[0].engine_num")[0].startswith("auxiliary_models[].engine_num")
    assert explain_lines("auxiliary_models.engine_num")[0].startswith("auxiliary_models[].engine_num")


def test_every_field_and_section_is_explained() -> None:
    for path, doc in schema_docs().items():
        lines = explain_lines(path)
        assert lines[0].startswith(f"{path}  ("), (path, lines[0])
        assert f"  {doc.help}" in lines


@pytest.mark.parametrize("key", ["", "nonsense.key.here", "actor.eps_clip.extra"])
def test_unknown_keys_are_user_errors(key: str) -> None:
    with pytest.raises(UserError, match="unknown config key"):
        explain_lines(key)


def test_explain_imports_no_heavy_package() -> None:
    """It answers on a login node in well under a second: no torch, transformers or vLLM on the way."""
    program = ("import sys, rlkit.cli.main as m\nsys.argv = ['rlkit', 'explain', 'actor.eps_clip']\n"
               "try:\n    m.main()\nexcept SystemExit as end:\n    assert end.code == 0, end.code\n"
               "heavy = {n.split('.')[0] for n in sys.modules} & {'torch', 'transformers', 'vllm', 'sglang'}\n"
               "print('heavy:', sorted(heavy))\n")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.splitlines()[-1] == "heavy: []", done.stdout
    assert "actor.eps_clip  (number" in done.stdout
