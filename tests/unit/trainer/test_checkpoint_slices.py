"""rlkit.trainer.checkpoint_slices.slice_plan: a plan (every state-dict entry of the model's meta skeleton from one
checkpoint tensor) exactly when the safetensors are what from_pretrained loads unchanged, and otherwise a reason
naming what differs (the caller then broadcasts rank 0's full model). The rows each rank reads are checked bitwise
against today's build in test_sharded_load."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from rlkit.models.source import build_causal_lm
from rlkit.trainer.checkpoint_slices import Slice, slice_plan
from rlkit.trainer.sharded_load import _decide
from tests.helpers.checkpoint_variants import Tensors, checkpoint_variant


def skeleton(path: Path) -> nn.Module:
    return build_causal_lm(str(path), dtype=torch.float32, attn_impl="sdpa", meta=True)


def plan_of(path: Path) -> list[Slice]:
    plan = slice_plan(skeleton(path), str(path))
    assert isinstance(plan, list), plan
    return plan


def test_every_tensor_comes_from_its_own_checkpoint_key(tiny_model_dir: Path) -> None:
    plan = plan_of(tiny_model_dir)
    names = list(skeleton(tiny_model_dir).state_dict())
    assert sorted(entry.name for entry in plan) == sorted(names)
    assert all(entry.key == entry.name and Path(entry.file) == tiny_model_dir / "model.safetensors" for entry in plan)


def test_a_tied_head_is_read_once_from_the_embedding(tied_model_dir: Path) -> None:
    plan = plan_of(tied_model_dir)
    assert "lm_head.weight" in skeleton(tied_model_dir).state_dict()
    assert [entry.key for entry in plan].count("model.embed_tokens.weight") == 1
    assert "lm_head.weight" not in {entry.key for entry in plan} | {entry.name for entry in plan}


def test_a_bf16_checkpoint_in_several_files_is_read_through_its_index(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = checkpoint_variant(tiny_model_dir, tmp_path / "m", lambda t: {k: v.bfloat16() for k, v in t.items()},
                             files=3)
    plan = plan_of(out)
    assert len({entry.file for entry in plan}) == 3 and all(entry.key == entry.name for entry in plan)


def _renamed(tensors: Tensors) -> Tensors:
    return {("norm.weight" if k == "model.norm.weight" else k): v for k, v in tensors.items()}


EDITS: dict[str, tuple[Callable[[Tensors], Tensors], str]] = {
    "renamed": (_renamed, "transformers renames or converts checkpoint keys: ['norm.weight -> model.norm.weight']"),
    "extra": (lambda t: {**t, "model.extra.weight": torch.zeros(2)}, "the model has no model.extra.weight"),
    "missing": (lambda t: {k: v for k, v in t.items() if k != "model.norm.weight"},
                "model.norm.weight: 0 checkpoint tensors"),
    "shape": (lambda t: {**t, "model.norm.weight": t["model.norm.weight"][:-1]},
              "model.norm.weight has shape [127], the model [128]"),
    "float64": (lambda t: {**t, "model.norm.weight": t["model.norm.weight"].double()}, "model.norm.weight is F64"),
    "tied_both": (lambda t: {**t, "lm_head.weight": t["model.embed_tokens.weight"].clone()},
                  "model.embed_tokens.weight / lm_head.weight: 2 checkpoint tensors"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_a_checkpoint_that_is_not_exactly_the_model_says_why(case: str, tiny_model_dir: Path, tied_model_dir: Path,
                                                             tmp_path: Path) -> None:
    edit, reason = EDITS[case]
    out = checkpoint_variant(tied_model_dir if case == "tied_both" else tiny_model_dir, tmp_path / "m", edit)
    assert slice_plan(skeleton(out), str(out)) == reason


def _write_index(out: Path, weight_map: object) -> None:
    (out / "model.safetensors").rename(out / "part.safetensors")
    (out / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


FILES: dict[str, tuple[Callable[[Path], None], str]] = {
    "no_safetensors": (lambda out: (out / "model.safetensors").unlink(),
                       "no model.safetensors or model.safetensors.index.json"),
    "outside": (lambda out: _write_index(out, {"x": "../part.safetensors"}),
                "model.safetensors.index.json names files outside the checkpoint's directory: ['../part.safetensors']"),
    "no_weight_map": (lambda out: _write_index(out, ["part.safetensors"]),
                      "model.safetensors.index.json has no weight_map of file names"),
    "corrupt": (lambda out: (out / "model.safetensors").write_bytes(b"\xff" * 64), "cannot read the checkpoint's"),
}


@pytest.mark.parametrize("case", sorted(FILES))
def test_a_checkpoint_without_readable_safetensors_says_why(case: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    out = checkpoint_variant(tiny_model_dir, tmp_path / "m")
    change, reason = FILES[case]
    change(out)
    got = slice_plan(skeleton(tiny_model_dir), str(out))
    assert isinstance(got, str) and got.startswith(reason), got


def test_a_key_in_two_files_and_a_quantized_model_fall_back(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = checkpoint_variant(tiny_model_dir, tmp_path / "m", files=2)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    first, second = sorted(set(index["weight_map"].values()))
    (out / second).write_bytes((out / first).read_bytes())  # the same keys in both files
    got = slice_plan(skeleton(tiny_model_dir), str(out))
    assert isinstance(got, str) and got.endswith(f"is in both {first} and {second}"), got
    model = skeleton(tiny_model_dir)
    model.config.quantization_config = {"quant_method": "fp8"}
    assert slice_plan(model, str(tiny_model_dir)) == "the checkpoint is quantized"
    nowhere = tmp_path / "nowhere"
    assert slice_plan(skeleton(tiny_model_dir), str(nowhere)) == f"{nowhere} is no local directory"


def test_rank_0_says_in_one_line_why_it_broadcasts_and_never_raises(tiny_model_dir: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = checkpoint_variant(tiny_model_dir, tmp_path / "m")
    _write_index(out, {"x": "part.safetensors"})
    (out / "model.safetensors.index.json").write_text("[1, 2]")  # valid JSON, no mapping: no exception escapes
    model = skeleton(tiny_model_dir)
    source, reason = _decide(model, str(out), lambda: skeleton(tiny_model_dir))
    assert source is None and isinstance(reason, str) and "AttributeError" in reason
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 1 and lines[0].startswith("rlkit train: rank 0 builds the whole model") and reason in lines[0]
    source, plan = _decide(model, str(tiny_model_dir), lambda: skeleton(tiny_model_dir))
    assert isinstance(plan, list) and source is not None and capsys.readouterr().out == ""
    loaded = build_causal_lm(str(tiny_model_dir), dtype=torch.float32, attn_impl="sdpa")  # from_pretrained's
    for name in ("model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"):
        ours, theirs = source.get_buffer(name), loaded.get_buffer(name)
        assert ours.device.type == "cpu" and ours.dtype == theirs.dtype and torch.equal(ours, theirs), name
    assert all(p.is_meta for p in source.parameters())  # no weights on the host
