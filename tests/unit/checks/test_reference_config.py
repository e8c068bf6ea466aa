"""The `ref` section at submit (rlkit.checks.reference, rlkit.config.schema.ref): which model the reference is,
every problem of ref.path named with its fix (not a model, another vocabulary, set where nothing loads a
reference), and ref.path bound into the containers and made absolute like actor.path. Torch-free."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rlkit.checks.binds import container_binds
from rlkit.checks.reference import validate_reference
from rlkit.checks.site_files import make_paths_absolute
from rlkit.config.load import config_from_mapping, load_config
from rlkit.config.problems import Problems
from rlkit.config.reference import reference_field, reference_load, reference_path, separate_reference
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.schema.ref import ReferenceLoad
from rlkit.jobs import REGISTRY, job_type_for
from rlkit.jobs.validate import validate

VOCAB = {"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2}}, "added_tokens": [{"id": 3, "content": "<eos>"}]}


def _model(directory: Path, *, vocab_size: int = 4, tokenizer: dict[str, Any] | None = None) -> Path:
    directory.mkdir(parents=True)
    (directory / "config.json").write_text(json.dumps({"vocab_size": vocab_size}))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer or VOCAB))
    return directory


@pytest.fixture
def actor(tmp_path: Path) -> Path:
    return _model(tmp_path / "actor")


@pytest.fixture
def sft_model(tmp_path: Path) -> Path:
    """Another model with the actor's vocabulary (its tokenizer.json written otherwise: same tokens, other bytes)."""
    directory = _model(tmp_path / "sft")
    (directory / "tokenizer.json").write_text(json.dumps(VOCAB, indent=2))
    return directory


def _config(actor: Path, *overrides: str, job: str = "grpo") -> ExperimentConfig:
    mapping = {"experiment_name": "e", "trial_name": "t", "type": job, "allocation_mode": "vllm:d1+fsdp:d1",
               "actor": {"path": str(actor)}}
    return config_from_mapping(mapping, list(overrides))


def uses_reference(config: ExperimentConfig) -> bool:
    """The job type's answer (rlkit.jobs.base.JobType.needs_reference)."""
    return job_type_for(config.type).needs_reference(config)


def _problems(config: ExperimentConfig) -> list[str]:
    problems = Problems()
    validate_reference(config, job_type_for(config.type), REGISTRY, problems)
    return [" ".join(str(e).split()) for e in problems.errors]  # the message and its fix on one line


def test_an_empty_ref_path_is_the_actors_start_as_before(actor: Path) -> None:
    config = _config(actor, "actor.kl_ctl=0.1")
    assert (reference_field(config), reference_path(config)) == ("actor.path", str(actor))
    assert uses_reference(config) and separate_reference(config) and _problems(config) == []
    assert not uses_reference(_config(actor)), "no KL term: no reference"
    assert not uses_reference(_config(actor, "actor.kl_ctl=0.1", job="sft")), "sft has no KL term"


@pytest.mark.parametrize("knob", ["actor.kl_ctl=0.1", "actor.kl_loss_coef=0.01"])
def test_another_model_with_the_actors_vocabulary_is_the_reference(actor: Path, sft_model: Path, knob: str) -> None:
    config = _config(actor, knob, f"ref.path={sft_model}")
    assert _problems(config) == []
    assert (reference_field(config), reference_path(config)) == ("ref.path", str(sft_model))


def test_dpo_takes_ref_path_and_its_own_dpo_ref_path_first(actor: Path, sft_model: Path, tmp_path: Path) -> None:
    config = _config(actor, f"ref.path={sft_model}", job="dpo")
    assert uses_reference(config) and reference_path(config) == str(sft_model) and _problems(config) == []
    same = _config(actor, f"ref.path={sft_model}", f"dpo.ref_path={sft_model}", job="dpo")
    assert reference_field(same) == "dpo.ref_path" and _problems(same) == []
    other = _model(tmp_path / "other")
    found = _problems(_config(actor, f"ref.path={sft_model}", f"dpo.ref_path={other}", job="dpo"))
    assert len(found) == 1 and "both name dpo's reference model, and they differ" in found[0], found


@pytest.mark.parametrize(("job", "overrides", "says", "fix"), [
    ("grpo", [], "actor.kl_ctl and actor.kl_loss_coef are both 0, so no reference model is loaded: it would be "
                 "ignored", "set actor.kl_ctl (a KL reward penalty) or actor.kl_loss_coef (a KL loss term) > 0"),
    ("ppo", ["actor.kl_ctl=0"], "both 0", "remove ref.path"),
    ("sft", ["actor.kl_ctl=0.1"], "job type sft loads no reference model", "remove the ref section"),
])
def test_a_ref_path_nothing_uses_is_refused(actor: Path, sft_model: Path, job: str, overrides: list[str], says: str,
                                            fix: str) -> None:
    found = _problems(_config(actor, f"ref.path={sft_model}", *overrides, job=job))
    assert len(found) == 1 and f"ref.path is set to '{sft_model}', but" in found[0], found
    assert says in found[0] and fix in found[0], found


def test_areals_ref_path_naming_the_actor_is_fine_without_a_kl_term(actor: Path) -> None:
    """AReaL's configs write `ref.path: ${actor.path}` whether or not a KL term is on: that is rlkit's default."""
    assert _problems(_config(actor, f"ref.path={actor}")) == []


def test_a_ref_path_that_is_no_model_is_refused_with_the_fix(actor: Path, tmp_path: Path) -> None:
    found = _problems(_config(actor, "actor.kl_ctl=0.1", f"ref.path={tmp_path / 'nothing'}"))
    assert found == [f"ref.path: '{tmp_path / 'nothing'}' is not a model directory (no config.json) fix: point to "
                     "a Hugging Face model directory on the shared filesystem"]


def test_a_reference_with_another_vocabulary_is_refused(actor: Path, tmp_path: Path) -> None:
    bigger = _model(tmp_path / "bigger", vocab_size=8)
    found = _problems(_config(actor, "actor.kl_ctl=0.1", f"ref.path={bigger}"))
    assert len(found) == 1 and f"ref.path: the reference model '{bigger}' has vocab_size 8, actor.path's model 4" \
        in found[0] and "leave ref.path empty" in found[0], found
    swapped = {"model": {"type": "BPE", "vocab": {"a": 0, "c": 1, "b": 2}}, "added_tokens": VOCAB["added_tokens"]}
    other = _model(tmp_path / "other-tokens", tokenizer=swapped)
    found = _problems(_config(actor, "actor.kl_ctl=0.1", f"ref.path={other}"))
    assert len(found) == 1 and "differs from the job's (actor.path" in found[0], found
    assert "token id 1 is 'c' in tokenizer.json of the reference, 'b' in the job's" in found[0], found
    # the job's tokenizer is tokenizer_path when set: that is what the reference is compared with
    assert _problems(_config(actor, "actor.kl_ctl=0.1", f"ref.path={other}", f"tokenizer_path={other}")) == []


def test_a_hub_id_is_left_to_the_submits_download(actor: Path) -> None:
    """An id not fetched yet (render) is not checked here: rlkit.launch.hub fetches it at submit, then the
    checks above read the local copy."""
    assert _problems(_config(actor, "actor.kl_ctl=0.1", "ref.path=acme/sft-model")) == []


def test_lora_with_another_reference_loads_it_and_without_one_uses_the_base(actor: Path, sft_model: Path) -> None:
    lora = ["actor.use_lora=true", "actor.kl_loss_coef=0.01"]
    assert not separate_reference(_config(actor, *lora)), "the base without the adapter, no second copy"
    assert not separate_reference(_config(actor, *lora, f"ref.path={actor}"))
    config = _config(actor, *lora, f"ref.path={sft_model}")
    assert separate_reference(config) and _problems(config) == []


def test_ref_dtype_and_attn_impl_default_to_the_actors_and_may_differ(actor: Path) -> None:
    plain = _config(actor, "actor.kl_ctl=0.1", "actor.dtype=float32", "actor.attn_impl=sdpa")
    assert reference_load(plain) == ReferenceLoad(str(actor), "float32", "sdpa")
    own = _config(actor, "actor.kl_ctl=0.1", "actor.dtype=float32", "ref.dtype=bfloat16", "ref.attn_impl=eager")
    assert reference_load(own) == ReferenceLoad(str(actor), "bfloat16", "eager") and _problems(own) == []


def test_with_lora_a_reference_dtype_of_its_own_loads_a_copy(actor: Path) -> None:
    """The adapter-off base computes in actor.dtype: a reference in another dtype must be a model of its own."""
    lora = ["actor.use_lora=true", "actor.kl_loss_coef=0.01", "actor.dtype=float32"]
    assert not separate_reference(_config(actor, *lora, "ref.dtype=float32"))
    assert separate_reference(_config(actor, *lora, "ref.dtype=bfloat16"))


def test_ref_dtype_and_attn_impl_problems_are_named_with_their_fix(actor: Path) -> None:
    assert _problems(_config(actor, "actor.kl_ctl=0.1", "ref.dtype=float64", "ref.attn_impl=flash")) == [
        "ref.dtype 'float64' is not one of: bfloat16, float16, float32 fix: e.g. ref.dtype=bfloat16, or leave it "
        "empty for actor.dtype",
        "ref.attn_impl 'flash' is not one of: flash_attention_2, sdpa, eager fix: e.g. "
        "ref.attn_impl=flash_attention_2, or leave it empty for actor.attn_impl"]
    unused = _problems(_config(actor, "actor.dtype=float32", "ref.dtype=bfloat16"))
    assert len(unused) == 1 and unused[0].startswith("ref.dtype is set to 'bfloat16', but actor.kl_ctl and "
                                                      "actor.kl_loss_coef are both 0"), unused
    assert _problems(_config(actor, "actor.dtype=float32", "ref.dtype=float32")) == [], "the actor's own: harmless"


def test_submits_checks_include_the_reference(grpo_yaml: Path, tmp_path: Path) -> None:
    unused = validate(load_config(grpo_yaml, [f"ref.path={tmp_path}"])).problems
    assert [e for e in unused.errors if "it would be ignored" in str(e)], [str(e) for e in unused.errors]
    missing = validate(load_config(grpo_yaml, ["actor.kl_ctl=0.1", f"ref.path={tmp_path / 'no'}"])).problems
    assert [str(e).splitlines()[0] for e in missing.errors] == [f"ref.path: '{tmp_path / 'no'}' is not a model "
                                                                "directory (no config.json)"]


def test_ref_path_is_bound_and_made_absolute_like_actor_path(generate_yaml: Path, sft_model: Path,
                                                            tmp_path: Path) -> None:
    config = load_config(generate_yaml, ["launcher.slurm.container_type=apptainer", f"ref.path={sft_model}"])
    _, added = container_binds(config)
    assert f"{sft_model}:{sft_model}" in [b.text() for b in added]
    relative = load_config(generate_yaml, ["ref.path=./sft"])
    make_paths_absolute(relative, str(tmp_path))
    assert relative.ref.path == str(sft_model)
    hub = load_config(generate_yaml, ["ref.path=acme/sft-model"])
    make_paths_absolute(hub, str(tmp_path))
    assert hub.ref.path == "acme/sft-model", "a hub id stays an id (fetched at submit)"
