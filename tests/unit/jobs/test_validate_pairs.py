"""Bad rw, dpo and critic settings are refused, each problem naming its field and its fix; good ones pass; the
checks stay torch-free."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rlkit.config.load import config_from_mapping
from rlkit.config.problems import Problems
from rlkit.config.ranges import check_ranges
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.jobs.pairs.checks import validate_critic, validate_dpo, validate_rw

Validator = Callable[[ExperimentConfig, Problems], None]


@pytest.fixture
def base(tmp_path: Path, fake_model: Path) -> dict[str, Any]:
    """A pair job that validates: a model directory with a tokenizer and a jsonl of text pairs."""
    (fake_model / "tokenizer.json").write_text("{}")
    data = tmp_path / "pairs.jsonl"
    data.write_text(json.dumps({"prompt": "Q: 1+1= A:", "chosen": " 2", "rejected": " b"}) + "\n")
    return {"experiment_name": "e", "trial_name": "t", "allocation_mode": "fsdp:d1", "actor": {"path": str(fake_model)},
            "train_dataset": {"path": str(data), "batch_size": 4}}


def problems_of(validator: Validator, mapping: dict[str, Any], *overrides: str) -> list[str]:
    problems, config = Problems(), config_from_mapping(mapping, list(overrides))
    check_ranges(config, problems)  # what rlkit.checks.experiment runs before every job type's checks
    validator(config, problems)
    return [str(e) for e in problems.errors]


@pytest.mark.parametrize("validator", [validate_rw, validate_dpo, validate_critic])
def test_a_good_config_passes(validator: Validator, base: dict[str, Any]) -> None:
    assert problems_of(validator, base) == []


def test_chat_pairs_pass_with_a_chat_template_and_are_refused_without(base: dict[str, Any], tmp_path: Path,
                                                                       fake_model: Path) -> None:
    data = tmp_path / "chat.jsonl"
    data.write_text(json.dumps({"prompt": [{"role": "user", "content": "hi"}], "chosen": "hello",
                                "rejected": [{"role": "assistant", "content": "go away"}]}) + "\n")
    found = problems_of(validate_dpo, base, f"train_dataset.path={data}")
    assert len(found) == 1 and "actor.path: the tokenizer in" in found[0] and "has no chat template" in found[0]
    (fake_model / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ messages }}"}))
    assert problems_of(validate_dpo, base, f"train_dataset.path={data}") == []
    (fake_model / "tokenizer_config.json").write_text("{}")
    (fake_model / "chat_template.jinja").write_text("{{ messages }}")
    assert problems_of(validate_dpo, base, f"train_dataset.path={data}") == []


@pytest.mark.parametrize(("validator", "overrides", "says", "hint"), [
    (validate_rw, ["rw.chosen_key=better"], "no column 'better'", "rw.chosen_key"),
    (validate_rw, ["rw.rejected_key=chosen"], "rw.chosen_key and rw.rejected_key are both 'chosen'",
     "rw.rejected_key=rejected"),
    (validate_rw, ["rw.rejected_key="], "rw.rejected_key is empty", "rw.rejected_key=rejected"),
    (validate_rw, ["actor.path="], "actor.path is not set", "model directory"),
    (validate_rw, ["train_dataset.max_length=1"], "train_dataset.max_length must be at least 2", "max_length=2048"),
    (validate_rw, ["train_dataset.path="], "train_dataset.path is not set", "{prompt, chosen, rejected}"),
    (validate_rw, ["train_dataset.prompt_key=question"], "no column 'question'", "train_dataset.prompt_key"),
    (validate_rw, ["train_dataset.prompt_key="], "no column ''", "train_dataset.prompt_key"),
    (validate_dpo, ["dpo.beta=0"], "dpo.beta must be positive", "dpo.beta=0.1"),
    (validate_dpo, ["dpo.beta=-0.1"], "dpo.beta must be positive", "dpo.beta=0.1"),
    (validate_dpo, ["dpo.loss_type=ipo"], "dpo.loss_type 'ipo'", "dpo.loss_type=sigmoid"),
    (validate_dpo, ["dpo.label_smoothing=0.5"], "dpo.label_smoothing must be in [0, 0.5)", "noisy labels"),
    (validate_dpo, ["actor.path="], "dpo has no reference model", "dpo.ref_path"),
    (validate_dpo, ["dpo.ref_path=/nonexistent/ref"], "dpo.ref_path: '/nonexistent/ref' is not a model directory",
     "Hugging Face model directory"),
    (validate_dpo, ["dpo.chosen_key=good"], "no column 'good'", "dpo.chosen_key"),
    (validate_critic, ["actor.path="], "the critic has no model", "critic.path"),
    (validate_critic, ["critic.path=/nonexistent/critic"], "critic.path: '/nonexistent/critic' is not a model",
     "Hugging Face model directory"),
    (validate_critic, ["critic.eps_clip=-0.2"], "critic.eps_clip must be positive", "critic.eps_clip=0.5"),
    (validate_critic, ["critic.eps_clip=0"], "critic.eps_clip must be positive", "critic.eps_clip=0.5"),
    (validate_critic, ["critic.optimizer.lr=0"], "critic.optimizer.lr must be positive", "critic.optimizer.lr=2e-05"),
    (validate_critic, ["critic.dtype=fp8"], "critic.dtype 'fp8'", "critic.dtype=bfloat16"),
    (validate_critic, ["critic.ppo_n_minibatches=3"], "does not split into critic.ppo_n_minibatches=3",
     "critic.ppo_n_minibatches"),
])
def test_refusals_name_the_field_and_the_fix(validator: Validator, base: dict[str, Any], overrides: list[str],
                                             says: str, hint: str) -> None:
    found = problems_of(validator, base, *overrides)
    assert any(says in p and hint in p for p in found), found


def test_answers_of_the_wrong_kind_are_refused(base: dict[str, Any], tmp_path: Path) -> None:
    data = tmp_path / "mixed.jsonl"
    data.write_text(json.dumps({"prompt": "text", "chosen": [{"role": "assistant", "content": "x"}],
                                "rejected": "y"}) + "\n")
    found = problems_of(validate_rw, base, f"train_dataset.path={data}")
    assert len(found) == 1 and "'chosen' (rw.chosen_key) is a list" in found[0]


def test_every_problem_is_collected_at_once(base: dict[str, Any]) -> None:
    found = problems_of(validate_dpo, base, "dpo.beta=0", "dpo.loss_type=hinge", "dpo.label_smoothing=-1",
                        "rw.chosen_key=x", "dpo.rejected_key=chosen", "actor.optimizer.lr=0")
    assert len(found) == 5, found  # rw's keys are not dpo's business


@pytest.mark.parametrize("validator", [validate_rw, validate_dpo])
def test_the_checks_every_trainer_gets_run_for_pairs(validator: Validator, base: dict[str, Any]) -> None:
    """rw and dpo refuse what grpo and sft refuse (rlkit.checks.trainer), each problem said once."""
    found = problems_of(validator, base, "recover.mode=resum", "total_train_epochs=0", "actor.mb_spec.n_mbs=0",
                        "actor.optimizer.type=adamw", "saver.freq_steps=0")
    for says in ("recover.mode 'resum' is not one of", "total_train_epochs must be at least 1",
                 "actor.mb_spec.n_mbs must be at least 1", "actor.optimizer.type 'adamw' is not one of",
                 "saver.freq_steps must be at least 1"):
        assert sum(says in p for p in found) == 1, (says, found)
    assert len(found) == 5, found


def test_validation_imports_no_torch() -> None:
    program = "import sys, rlkit.jobs.pairs.checks; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
