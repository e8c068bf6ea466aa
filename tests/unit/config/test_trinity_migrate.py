"""`rlkit migrate` reads Trinity-RFT's configs (issue 49 item 6): a Trinity-RFT-shaped file (written from its
configuration guide, ../shared/seeds/trinity-rft-config-guide.md) migrates to the rlkit fields of its synchronizer,
algorithm, model and buffer keys, every key left out is named in the header, the sync styles rlkit has not built are
refused naming why, and a file that is neither AReaL's nor Trinity-RFT's exits 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkit.cli.key_maps import TRINITY
from rlkit.config.trinity import RENAMES, SYNC_METHODS, as_rlkit_file, trinity_to_rlkit
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit

SITE = ["launcher.slurm.container_type=none"]


def _trinity(**changes: Any) -> dict[str, Any]:
    """An OPMD run as Trinity-RFT's guide writes one; `changes`: {"section.key": value} (None removes it)."""
    data: dict[str, Any] = {
        "project": "trinity-demo", "name": "opmd-run", "mode": "both", "checkpoint_root_dir": "/tmp/rlkit-ckpt",
        "continue_from_checkpoint": True,
        "algorithm": {"algorithm_type": "opmd", "repeat_times": 8,
                      "optimizer": {"lr": 1e-6, "lr_scheduler_type": "constant"},
                      "advantage_fn_args": {"opmd_baseline": "logavgexp", "tau": 2.0}, "entropy_loss_fn": "default"},
        "model": {"model_path": "/tmp/model", "max_response_tokens": 64},
        "cluster": {"node_num": 1, "gpu_per_node": 8},
        "buffer": {"batch_size": 16, "total_epochs": 2,
                   "explorer_input": {"taskset": {"name": "train", "storage_type": "file", "path": "/tmp/d.jsonl",
                                                  "format": {"prompt_key": "question"},
                                                  "rollout_args": {"temperature": 1.0}},
                                      "eval_tasksets": [{"name": "eval", "path": "/tmp/e.jsonl"}],
                                      "default_reward_fn_type": "countdown_reward"},
                   "trainer_input": {"experience_buffer": {"name": "buf", "storage_type": "queue"}}},
        "explorer": {"eval_interval": 10,
                     "rollout_model": {"engine_type": "vllm_async", "engine_num": 2, "tensor_parallel_size": 2}},
        "synchronizer": {"sync_method": "nccl", "sync_interval": 4, "sync_offset": 1, "sync_timeout": 1200,
                         "sync_style": "fixed"},
        "trainer": {"save_interval": 100, "grad_clip": 1.0, "ulysses_sequence_parallel_size": 1},
    }
    for key, value in changes.items():
        *parents, last = key.split(".")
        tree = data
        for part in parents:
            tree = tree.setdefault(part, {})
        if value is None:
            tree.pop(last, None)
        else:
            tree[last] = value
    return data


def _write(tmp_path: Path, data: dict[str, Any]) -> Path:
    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_trinity_config_migrates_to_rlkit_fields(tmp_path: Path) -> None:
    from rlkit.config.areal.migrate import migrate

    with as_rlkit_file(_write(tmp_path, _trinity())) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    config = prepare(clean, [], dry_run=True).config
    assert (config.type, config.experiment_name, config.trial_name) == ("opmd", "trinity-demo", "opmd-run")
    assert (config.actor.weight_update_interval, config.actor.weight_update_offset) == (4, 1)
    assert (config.actor.weight_update_mode, config.actor.weight_update_timeout) == ("xccl", 1200)
    assert (config.opmd.tau, config.opmd.opmd_baseline) == (2.0, "logavgexp")
    assert config.allocation_mode == "vllm:d2t2+fsdp:d4"
    assert (config.train_dataset.path, config.train_dataset.batch_size, config.train_dataset.prompt_key) == \
        ("/tmp/d.jsonl", 16, "question")
    assert (config.valid_dataset.path, config.evaluator.freq_steps) == ("/tmp/e.jsonl", 10)
    assert (config.gconfig.n_samples, config.gconfig.max_new_tokens, config.actor.optimizer.lr) == (8, 64, 1e-6)
    assert (config.recover.mode, config.saver.freq_steps, config.cluster.fileroot) == ("auto", 100, "/tmp/rlkit-ckpt")
    assert "#   synchronizer.sync_method: nccl  -> moved to actor.weight_update_mode as xccl" in header
    assert "#   algorithm.entropy_loss_fn: default  -> left out (rlkit has no entropy bonus)" in header
    for left_out in ("buffer.explorer_input.default_reward_fn_type", "buffer.trainer_input.experience_buffer.name",
                     "trainer.ulysses_sequence_parallel_size", "synchronizer.sync_style", "mode"):
        assert f"#   {left_out}: " in header and "left out (" in header.split(f"#   {left_out}: ")[1].split("\n")[0]


def test_mix_is_grpo_with_the_expert_rows() -> None:
    aux = "buffer.trainer_input.auxiliary_buffers"
    mapping, fates = trinity_to_rlkit(_trinity(**{"algorithm.algorithm_type": "mix", "algorithm.advantage_fn_args":
                                                  None, "algorithm.policy_loss_fn_args": {"mu": 0.2},
                                                  f"{aux}.sft_dataset": {"path": "/tmp/sft.jsonl",
                                                                         "format": {"response_key": "answer"}}}), "t")
    assert mapping["type"] == "grpo" and mapping["mix"] == {"mu": 0.2}
    assert mapping["expert_dataset"] == {"path": "/tmp/sft.jsonl"} and mapping["sft"] == {"response_key": "answer"}
    with pytest.raises(ConfigError, match=r"algorithm_type mix .* needs its expert data"):
        trinity_to_rlkit(_trinity(**{"algorithm.algorithm_type": "mix"}), "t")
    assert not [f for f in fates if f.fate.startswith("left out") and f.key.startswith("algorithm.policy")]


@pytest.mark.parametrize("changes, says", [
    ({"synchronizer.sync_style": "explorer_driven"}, "sync_style 'explorer_driven' .* is not built"),
    ({"synchronizer.sync_style": "trainer_driven"}, "sync_style 'trainer_driven' .* is not built"),
    ({"synchronizer.sync_method": "rdma"}, "sync_method 'rdma' .* has no rlkit weight_update_mode"),
    ({"algorithm.algorithm_type": "sapo"}, "algorithm_type 'sapo' .* has no rlkit job type"),
    ({"mode": "train"}, "mode 'train'"),
    ({"explorer.rollout_model.engine_num": 4}, "leave the trainer none"),
])
def test_what_rlkit_has_not_built_is_refused_naming_why(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        trinity_to_rlkit(_trinity(**changes), "t")


def test_dynamic_batch_size_is_packing() -> None:
    for value in (False, True):
        mapping, fates = trinity_to_rlkit(_trinity(**{"trainer.use_dynamic_bsz": value,
                                                      "trainer.max_token_len_per_gpu": 16384}), "t")
        assert mapping["actor"]["mb_spec"] == {"packing": value, "max_tokens_per_mb": 16384}
        assert not [f for f in fates if f.key == "trainer.use_dynamic_bsz" and f.fate.startswith("left out")]


def test_checkpoint_sync_is_a_disk_push() -> None:
    mapping, _ = trinity_to_rlkit(_trinity(**{"synchronizer.sync_method": "checkpoint"}), "t")
    assert mapping["actor"]["weight_update_mode"] == "disk"


def test_on_the_command_line(tmp_path: Path) -> None:
    refused = run_rlkit("migrate", str(_write(tmp_path, _trinity(**{"synchronizer.sync_style": "trainer_driven"}))),
                        *SITE)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert "not built" in refused.stderr and "sync_style" in refused.stderr
    neither = tmp_path / "neither.yaml"
    neither.write_text("runtime:\n  steps: 3\nmodels:\n  policy: {}\n")
    done = run_rlkit("migrate", str(neither))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "neither an rlkit (AReaL) config nor a Trinity-RFT config" in done.stderr


def test_the_key_map_page_says_what_migrate_does() -> None:
    """rlkit/cli/key_maps.py's Trinity-RFT table (the docs) agrees with the keys migrate moves."""
    documented = {entry.their: entry.ours for entry in TRINITY}
    for their, ours in RENAMES.items():
        if their in documented:
            assert documented[their] == ours, their
    assert documented["synchronizer.sync_method"] == "actor.weight_update_mode"
    assert {"nccl": "xccl", "checkpoint": "disk"}.items() <= SYNC_METHODS.items()
    for their, ours in documented.items():
        if their.startswith("synchronizer.") and ours:
            assert their in RENAMES or their == "synchronizer.sync_method", their
