"""The LoRA fields' submit-time checks (rlkit.checks.lora): each mistake named with its fix, all collected."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from rlkit.checks.lora import validate_lora
from rlkit.checks.model_modules import tensor_names
from rlkit.config.problems import Problems
from rlkit.config.ranges import check_ranges
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.servers.vllm.command import server_lora_rank


def lora_config(**actor: object) -> ExperimentConfig:
    config = ExperimentConfig()
    config.allocation_mode = "vllm:d1+fsdp:d2"
    config.actor.use_lora = True
    config.actor.target_modules = ["q_proj", "v_proj"]
    for name, value in actor.items():
        setattr(config.actor, name, value)
    return config


def messages(config: ExperimentConfig) -> list[str]:
    problems = Problems()
    check_ranges(config, problems)  # what rlkit.checks.experiment runs first: lora_rank and lora_alpha's ranges
    validate_lora(config, problems)
    return [str(e) for e in problems.errors]


def test_a_sound_lora_config_passes() -> None:
    assert messages(lora_config()) == []
    assert messages(lora_config(lora_rank=512)) == []


@pytest.mark.parametrize(("changes", "field"), [
    ({"peft_type": "prefix_tuning"}, "actor.peft_type"),
    ({"lora_rank": 0}, "actor.lora_rank"),
    ({"lora_rank": -4}, "actor.lora_rank"),
    ({"lora_rank": 513}, "actor.lora_rank"),
    ({"lora_alpha": 0}, "actor.lora_alpha"),
    ({"target_modules": []}, "actor.target_modules"),
    ({"target_modules": ["q_proj", " "]}, "actor.target_modules"),
    ({"target_modules": ["lm_head"]}, "actor.target_modules"),
    ({"weight_update_mode": "xccl"}, "actor.weight_update_mode"),
])
def test_each_mistake_names_its_field(changes: dict[str, object], field: str) -> None:
    found = messages(lora_config(**changes))
    assert len(found) == 1 and found[0].startswith(field), found


def test_sglang_servers_take_adapters_of_the_modules_sglang_knows() -> None:
    config = lora_config(lora_rank=600)  # no vLLM rank limit: SGLang's --max-lora-rank is the rank itself
    config.allocation_mode = "sglang:d1+fsdp:d1"
    assert messages(config) == []
    config.actor.target_modules = ["all-linear"]
    assert messages(config) == []
    config.actor.target_modules = ["q_proj", "c_attn"]  # a GPT-2 name: SGLang's --lora-target-modules refuses it
    [message] = messages(config)
    assert message.startswith("actor.target_modules: ['c_attn']") and "SGLang" in message and "q_proj" in message
    config.actor.target_modules = ["q_proj"]
    config.sglang.extra_args = {"max-lora-rank": 8, "lora_target_modules": ["all"], "lora_backend": "triton"}
    found = messages(config)
    assert [m.split(":")[0] for m in found] == ["sglang.extra_args.max_lora_rank",
                                                "sglang.extra_args.lora_target_modules"]
    config.sglang.extra_args = {}
    config.actor.weight_update_mode = "xccl"  # adapters go by disk whatever the servers
    assert [m.split(":")[0] for m in messages(config)] == ["actor.weight_update_mode"]


def test_rlkit_owned_server_options_are_refused_in_extra_args() -> None:
    config = lora_config()
    config.vllm.extra_args = {"max-lora-rank": 8, "enable_lora": True, "max_loras": 4}
    found = messages(config)
    assert [m.split(":")[0] for m in found] == ["vllm.extra_args.enable_lora", "vllm.extra_args.max_lora_rank"]


def test_every_problem_is_collected_and_lora_off_checks_only_peft_type() -> None:
    assert len(messages(lora_config(lora_rank=0, lora_alpha=-1, target_modules=[], weight_update_mode="xccl"))) == 4
    off = lora_config(use_lora=False, lora_rank=16, target_modules=[], peft_type="ia3")
    assert [m.split(":")[0] for m in messages(off)] == ["actor.peft_type"]


def test_trainer_only_and_unparsable_allocations_skip_the_server_checks() -> None:
    config = lora_config()
    config.allocation_mode = "fsdp:d2"
    assert messages(config) == []
    # no servers (sft, dpo): no adapter goes anywhere, so neither the transport nor vLLM's rank limit applies
    config.actor.weight_update_mode, config.actor.lora_rank = "xccl", 600
    assert messages(config) == []
    config.allocation_mode = "nonsense"
    assert messages(config) == []  # reported by the allocation check, not twice


def test_server_rank_is_the_smallest_vllm_rank_that_holds_the_adapter() -> None:
    assert [server_lora_rank(r) for r in (1, 2, 8, 9, 32, 33, 300, 512)] == [1, 8, 8, 16, 32, 64, 320, 512]
    with pytest.raises(ValueError, match="512"):
        server_lora_rank(513)


def _fake_weights(model: Path, names: list[str], file: str = "model.safetensors") -> None:
    """A safetensors file whose header names `names` (the weights themselves are never read by the check)."""
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    header = json.dumps({n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                         for i, n in enumerate(names)}).encode()
    (model / file).write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * len(names)))


QWEN_NAMES = [*(f"model.layers.{i}.{m}.weight" for i in range(2)
                for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.up_proj")),
              "model.norm.weight", "lm_head.weight"]


def test_target_modules_are_checked_against_the_models_safetensors(tmp_path: Path) -> None:
    model = tmp_path / "model"
    _fake_weights(model, QWEN_NAMES)
    assert messages(lora_config(path=str(model), target_modules=["q_proj", "self_attn.v_proj", "up_proj"])) == []
    assert messages(lora_config(path=str(model), target_modules=["all-linear"])) == []
    [message] = messages(lora_config(path=str(model), target_modules=["q_proj", "qkv_proj", "gate_proj"]))
    assert message.startswith("actor.target_modules: qkv_proj, gate_proj are not a module of the model at")
    assert "q_proj, up_proj, v_proj" in message  # the hint lists the model's own modules


def test_sharded_and_unreadable_weights(tmp_path: Path) -> None:
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": dict.fromkeys(QWEN_NAMES, "a")}))
    assert tensor_names(str(sharded)) == QWEN_NAMES
    [message] = messages(lora_config(path=str(sharded), target_modules=["k_proj"]))
    assert "k_proj is not a module" in message
    hostile = tmp_path / "hostile"
    hostile.mkdir()
    (hostile / "model.safetensors").write_bytes(struct.pack("<Q", 2**62) + b"{}")  # a header size no model has
    assert tensor_names(str(hostile)) is None and messages(lora_config(path=str(hostile))) == []
    assert tensor_names(str(tmp_path / "nothing-here")) is None and tensor_names("Qwen/Qwen3-0.6B") is None
