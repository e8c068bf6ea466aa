"""`rlkit migrate` reads Trinity-RFT's offline runs (`mode: train` with algorithm_type sft or dpo, written from its
configuration guide, ../shared/seeds/trinity-rft-config-guide.md): the experience buffer becomes train_dataset, its
format the sft / dpo row format, the servers' keys are named as left out, and the result loads and renders as
rlkit's trainer-only sft / dpo jobs. `mode: train` with an RL algorithm is refused naming why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from rlkit.config.trinity import as_rlkit_file, trinity_to_rlkit
from rlkit.errors import ConfigError
from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.conftest import run_rlkit
from tests.helpers.dotted_changes import with_changes

SITE = ["launcher.slurm.container_type=none"]
BUFFER = "buffer.trainer_input.experience_buffer"


def _offline(kind: str, **changes: Any) -> dict[str, Any]:
    """A Trinity-RFT `mode: train` run of algorithm_type `kind` (sft or dpo), as its guide and examples write one;
    `changes`: {"section.key": value} (None removes it)."""
    fmt: dict[str, Any] = ({"prompt_type": "messages", "messages_key": "messages"} if kind == "sft"
                           else {"prompt_type": "messages", "messages_key": "prompt", "chosen_key": "chosen",
                                 "rejected_key": "rejected"})
    data: dict[str, Any] = {
        "mode": "train", "project": "trinity-offline", "name": f"{kind}-run", "checkpoint_root_dir": "/tmp/rlkit-ckpt",
        "algorithm": {"algorithm_type": kind, "optimizer": {"lr": 1e-5}},
        "model": {"model_path": "/tmp/model", "max_response_tokens": 1024, "max_model_len": 2048},
        "cluster": {"node_num": 1, "gpu_per_node": 8},
        "buffer": {"total_epochs": 2, "batch_size": 32, "train_batch_size": 64,
                   "trainer_input": {"experience_buffer": {"name": f"{kind}_buffer", "storage_type": "file",
                                                           "path": f"/tmp/{kind}.jsonl", "split": "train",
                                                           "format": fmt}}},
        "synchronizer": {"sync_method": "checkpoint", "sync_interval": 10},
        "trainer": {"save_interval": 10, "grad_clip": 1.0},
    }
    return with_changes(data, changes)


def _migrated(tmp_path: Path, data: dict[str, Any]) -> tuple[Any, str, Path]:
    """The migrated file as rlkit loads it (prepare, dry run), its header, and the file."""
    from rlkit.config.areal.migrate import migrate

    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(data))
    with as_rlkit_file(path, REGISTRY.trinity_algorithms) as (source, header):
        text, _ = migrate(source, SITE, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(header + text)
    return prepare(clean, [], dry_run=True).config, header, clean


def test_an_sft_run_is_rlkit_s_sft_job(tmp_path: Path) -> None:
    config, header, _ = _migrated(tmp_path, _offline("sft"))
    assert (config.type, config.allocation_mode, config.trial_name) == ("sft", "fsdp:d8", "sft-run")
    data = config.train_dataset
    assert (data.path, data.split, data.type, data.batch_size, data.shuffle) == ("/tmp/sft.jsonl", "train", "sft", 64,
                                                                                  False)
    assert (config.sft.prompt_type, config.sft.messages_key) == ("messages", "messages")
    assert (config.total_train_epochs, config.actor.optimizer.lr, config.saver.freq_steps) == (2, 1e-5, 10)
    assert "#   synchronizer.sync_method: checkpoint  -> left out (mode train: rlkit's sft job runs the trainer " \
           "alone" in header
    assert "#   model.max_model_len: 2048  -> left out (mode train" in header
    assert "#   buffer.batch_size: 32  -> left out (train_batch_size, the trainer's, is read)" in header
    assert "#   mode: train  -> left out (train: rlkit's sft job type runs the trainer alone)" in header


def test_sft_plaintext_rows_and_trinity_s_format_defaults(tmp_path: Path) -> None:
    """Trinity-RFT's FormatConfig reads messages from a column 'message' unless told otherwise (rlkit's sft: plaintext
    and 'messages'); plaintext's keys and the model's chat template move to the sft section."""
    fmt = f"{BUFFER}.format"
    config, _, _ = _migrated(tmp_path, _offline("sft", **{fmt: {}}))
    assert (config.sft.prompt_type, config.sft.messages_key) == ("messages", "message")
    plain = {"prompt_type": "plaintext", "prompt_key": "question", "response_key": "answer",
             "system_prompt": "Be brief.", "messages_key": "ignored"}
    config, header, _ = _migrated(tmp_path, _offline("sft", **{fmt: plain, "model.custom_chat_template": "{{x}}"}))
    sft = config.sft
    assert (sft.prompt_type, sft.prompt_key, sft.response_key, sft.system_prompt) == ("plaintext", "question",
                                                                                      "answer", "Be brief.")
    assert (sft.messages_key, sft.chat_template) == ("messages", "{{x}}")
    assert f"#   {fmt}.messages_key: ignored  -> left out (prompt_type plaintext" in header


@pytest.mark.parametrize(("tools_key", "ours", "fate"), [
    ("functions", "functions", "moved to sft.tools_key"),
    ("tools", "tools", "moved to sft.tools_key"),
    (None, "", "moved to sft.tools_key (None: no tools column read)"),
])
def test_sft_s_tools_column_moves(tmp_path: Path, tools_key: str | None, ours: str, fate: str) -> None:
    """Trinity-RFT's SFT formatter gives the row's tools column (format.tools_key, default 'tools') to the chat
    template, as rlkit's sft.tools_key does; its dpo reads no tools."""
    key = f"{BUFFER}.format.tools_key"
    data = _offline("sft")
    data["buffer"]["trainer_input"]["experience_buffer"]["format"]["tools_key"] = tools_key  # None too
    config, header, _ = _migrated(tmp_path, data)
    assert config.sft.tools_key == ours
    assert f"#   {key}: {tools_key if tools_key else 'null'}  -> {fate}" in header
    assert _migrated(tmp_path, _offline("sft"))[0].sft.tools_key == "tools"  # both defaults: the same column
    _, header, _ = _migrated(tmp_path, _offline("dpo", **{key: "tools"}))
    assert f"#   {key}: tools  -> left out (Trinity-RFT's dpo reads no tools)" in header


def test_a_dpo_run_is_rlkit_s_dpo_job(tmp_path: Path) -> None:
    data = _offline("dpo", **{"algorithm.policy_loss_fn_args": {"beta": 0.2, "label_smoothing": 0.1},
                              "algorithm.kl_loss_fn": "none"})
    config, header, _ = _migrated(tmp_path, data)
    assert (config.type, config.allocation_mode) == ("dpo", "fsdp:d8")
    assert (config.train_dataset.path, config.train_dataset.prompt_key, config.train_dataset.batch_size) == (
        "/tmp/dpo.jsonl", "prompt", 64)
    assert (config.dpo.chosen_key, config.dpo.rejected_key, config.dpo.beta, config.dpo.label_smoothing) == (
        "chosen", "rejected", 0.2, 0.1)
    assert "#   algorithm.kl_loss_fn: none  -> left out" in header


@pytest.mark.parametrize("kl", [None, "none", "k2"])
def test_trinity_s_forced_kl_term_of_dpo_is_named_as_what_the_run_lacks(tmp_path: Path, kl: str | None) -> None:
    """Trinity-RFT's DPOAlgorithm.check_config turns kl_loss_fn none (or unset) into k2 at kl_coef 0.001: every dpo
    run of it has that term, rlkit's dpo none; at the default coefficient the migration says so and goes on."""
    config, header, _ = _migrated(tmp_path, _offline("dpo", **{"algorithm.kl_loss_fn": kl}))
    assert config.type == "dpo"
    shown = "(unset)" if kl is None else kl
    assert f"#   algorithm.kl_loss_fn: {shown}  -> left out (Trinity-RFT adds k2 at kl_coef 0.001 to every dpo run" \
        in header, header


@pytest.mark.parametrize(("changes", "says"), [
    ({"algorithm.algorithm_type": "grpo"}, "mode 'train' with algorithm_type 'grpo' (t): rlkit trains sft and dpo "
                                           "from a dataset alone"),
    ({"mode": "explore"}, "mode 'explore' (t)"),
    ({f"{BUFFER}.format.prompt_type": "plaintext"}, "format.prompt_type plaintext (t): Trinity-RFT sends a text pair "
                                                    "through the chat template"),
    ({f"{BUFFER}.storage_type": "queue"}, "experience_buffer.storage_type 'queue' (t)"),
    ({f"{BUFFER}.path": None}, "experience_buffer.path (t): mode train reads its rows"),
    ({"buffer.train_batch_size": None}, "buffer.train_batch_size (t): Trinity-RFT requires it in mode train"),
    ({"algorithm.kl_loss_fn": "k3"}, "algorithm.kl_loss_fn 'k3' (t): rlkit's dpo adds no KL term"),
    ({"algorithm.kl_loss_fn_args": {"kl_coef": 0.01}}, "algorithm.kl_loss_fn_args.kl_coef 0.01 (t): rlkit's dpo adds "
                                                       "no KL term, and this is not Trinity-RFT's default 0.001"),
    ({"algorithm.policy_loss_fn_args": {"beta": 0.1, "ftx": 1.0}}, "policy_loss_fn_args.ftx 1.0 (t)"),
    ({f"{BUFFER}.format.chat_template": "{{x}}"}, "format.chat_template (t): rlkit's dpo has no such setting"),
])
def test_what_an_offline_run_cannot_carry_is_refused_naming_the_key(changes: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError) as raised:
        trinity_to_rlkit(_offline("dpo", **changes), "t", REGISTRY.trinity_algorithms)
    assert says in str(raised.value)


def test_sft_without_train_batch_size_reads_batch_size_and_refuses_a_kl_term() -> None:
    """Older Trinity-RFT releases read batch_size x repeat_times (1 for sft); an auxiliary buffer (mix's expert rows)
    is not read by sft, and its format does not become the sft section's."""
    aux = {"sft_dataset": {"path": "/tmp/expert.jsonl", "format": {"prompt_key": "q"}}}
    mapping, fates = trinity_to_rlkit(_offline("sft", **{"buffer.train_batch_size": None,
                                                         "buffer.trainer_input.auxiliary_buffers": aux}), "t",
                                      REGISTRY.trinity_algorithms)
    assert mapping["train_dataset"]["batch_size"] == 32
    assert "expert_dataset" not in mapping and "prompt_key" not in mapping["sft"]
    assert "only algorithm_type mix reads it" in {f.key: f.fate for f in fates}[
        "buffer.trainer_input.auxiliary_buffers.sft_dataset.format.prompt_key"]
    with pytest.raises(ConfigError, match=r"entropy_loss_fn 'default' .* rlkit's sft adds no KL"):
        trinity_to_rlkit(_offline("sft", **{"algorithm.entropy_loss_fn": "default"}), "t",
                         REGISTRY.trinity_algorithms)


def test_on_the_command_line(tmp_path: Path) -> None:
    """migrate prints the rlkit file, render renders it: one sbatch script of a trainer alone."""
    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(_offline("dpo")))
    migrated = run_rlkit("migrate", str(path), *SITE)
    assert migrated.returncode == 0, migrated.stderr
    clean = tmp_path / "dpo.yaml"
    clean.write_text(migrated.stdout)
    rendered = run_rlkit("render", str(clean))
    assert rendered.returncode == 0 and "Traceback" not in rendered.stderr, rendered.stderr
    assert "#SBATCH" in rendered.stdout and "hetjob" not in rendered.stdout


def _staged(**rft: Any) -> dict[str, Any]:
    """The guide's two stages: an SFT warm-up (mode train), then the file's own RFT run (`rft`: that stage's keys)."""
    from tests.unit.config.test_trinity_migrate import _trinity

    data = _trinity(**{"algorithm.optimizer.lr": 3e-6})
    warmup = {"stage_name": "sft_warmup", "mode": "train", "algorithm": {"algorithm_type": "sft"},
              "buffer": {"train_batch_size": 64, "total_steps": 100,
                         "trainer_input": {"experience_buffer": {"name": "sft_buffer", "path": "/tmp/sft.jsonl"}}}}
    data["stages"] = [warmup, {"stage_name": "rft", **rft}]
    return data


def test_trinity_s_stages_are_rlkit_s_stages(tmp_path: Path) -> None:
    """Each stage is the global file with the sections it sets replaced whole (the warm-up's algorithm section has no
    optimizer: Trinity-RFT's default lr); the RFT stage starts from the warm-up's final model, as Trinity-RFT's
    second stage starts from the first's latest checkpoint."""
    from rlkit.launch.stages import prepare_stages

    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(_staged()))
    with as_rlkit_file(path, REGISTRY.trinity_algorithms) as (source, header):
        staged = yaml.safe_load(source.read_text())
        plans, _ = prepare_stages(source, SITE, dry_run=True)
    assert (staged["actor"], staged["trial_name"]) == ({"path": "/tmp/model"}, "opmd-run")
    assert all("path" not in stage.get("actor", {}) for stage in staged["stages"])
    warmup, rft = (plan.prepared.config for plan in plans)
    assert (warmup.type, warmup.allocation_mode, warmup.train_dataset.path, warmup.total_train_steps) == (
        "sft", "fsdp:d8", "/tmp/sft.jsonl", 100)
    assert (warmup.sft.prompt_type, warmup.sft.messages_key, warmup.actor.optimizer.lr) == ("messages", "message",
                                                                                           1e-6)
    assert (rft.type, rft.allocation_mode, rft.actor.optimizer.lr) == ("opmd", "vllm:d2t2+fsdp:d4", 3e-6)
    assert rft.actor.path == "/tmp/rlkit-ckpt/trinity-demo/opmd-run_sft_warmup/checkpoints/final"
    assert "#   [stage 1 sft_warmup] mode: train  -> left out (train: rlkit's sft job type" in header
    assert "#   [stage 2 rft] synchronizer.sync_method: nccl  -> moved to actor.weight_update_mode" in header


@pytest.mark.parametrize(("rft", "says"), [
    ({"mode": "train"}, "mode 'train' with algorithm_type 'opmd' (in {path}, stage rft)"),
    ({"model": {"model_path": "/tmp/other"}}, "stage rft (in {path}) sets model: a Trinity-RFT stage sets only"),
    ({"stage_name": "sft_warmup"}, "two stages (in {path}) are named sft_warmup"),
    ({"stage_name": ""}, "stages[1] (in {path}) is not a mapping with its stage_name"),
])
def test_a_stage_rlkit_cannot_run_is_refused_naming_it(tmp_path: Path, rft: dict[str, Any], says: str) -> None:
    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(_staged(**rft)))
    with pytest.raises(ConfigError) as raised, as_rlkit_file(path, REGISTRY.trinity_algorithms):
        pass
    assert says.format(path=path) in str(raised.value)


def test_stages_on_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "trinity.yaml"
    path.write_text(yaml.safe_dump(_staged()))
    migrated = run_rlkit("migrate", str(path), *SITE)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.startswith("# Trinity-RFT config trinity.yaml read by `rlkit migrate`")
    clean = tmp_path / "staged.yaml"
    clean.write_text(migrated.stdout)
    rendered = run_rlkit("render", str(clean))
    assert rendered.returncode == 0 and "Traceback" not in rendered.stderr, rendered.stderr
    assert "# ---- stage rft: trial opmd-run_rft (afterok the stage before)" in rendered.stdout
    assert "opmd-run_sft_warmup/checkpoints/final (handed over)" in rendered.stdout


def test_a_stage_s_null_section_is_the_global_one() -> None:
    """Trinity-RFT sets a stage's section only when it is not None: `mode: null` in a stage keeps the global mode."""
    from rlkit.config.trinity_stages import stages_to_rlkit

    data = {**_offline("sft"), "stages": [{"stage_name": "only", "mode": None, "algorithm": None}]}
    mapping, _ = stages_to_rlkit(data, "t", lambda stage, source: (
        trinity_to_rlkit(stage, source, REGISTRY.trinity_algorithms)[0], []))
    assert [(stage["stage_name"], stage["type"]) for stage in mapping["stages"]] == [("only", "sft")]
