"""AReaL's own example configs (tests/data/areal, pinned in its SOURCE.md) render on rlkit with only site settings
changed, printing the one notice of the AReaL keys rlkit accepts without using; and the three refusals the
issue names (styles that disagree, a derived key that disagrees, an unsupported training key) exit 2 naming each
key, all at once."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from rlkit.jobs import REGISTRY
from rlkit.launch.submit import prepare
from tests.conftest import REPO, run_rlkit

EXAMPLES = REPO / "tests" / "data" / "areal"
GSM8K_ROWS = [{"question": f"Tom has {n} apples and buys 3 more. How many apples does he have?",
               "answer": f"He has {n} + 3 = {n + 3} apples.\n#### {n + 3}"} for n in range(8)]
PAIR_ROWS = [{"chosen": f"\n\nHuman: Say hello {n}.\n\nAssistant: Hello!",  # hh-rlhf's whole conversations
              "rejected": f"\n\nHuman: Say hello {n}.\n\nAssistant: No."} for n in range(8)]

# What "site settings" means here: where the model, the data and the trial files live, how steps run (no
# Apptainer on this machine), and what the nodes have (the CPU example says 0 GPUs, the dev cluster's nodes have 8).
# Every file's own `cluster.n_nodes: 1` is kept: servers and trainer share the node (a packed placement). The steps
# run the nodes' python3 (launcher.python): bare steps otherwise run this interpreter, and this venv has no SGLang,
# which most of the examples serve with (rlkit.checks.host_python).
SITE = ["launcher.slurm.container_type=none", "cluster.n_gpus_per_node=8", "launcher.python=python3"]
# `type` is not a site setting: AReaL picks the algorithm by its entry script, and rlkit asks for it (issue 14
# item 4) except where the training rows leave one choice (sft, rw, dpo rows).
CASES = {
    "current/gsm8k_grpo": ["type=grpo"],
    "current/gsm8k_grpo_cpu": ["type=grpo"],
    "current/gsm8k_grpo_lora": ["type=grpo"],  # as written: SGLang servers with LoRA
    "current/gsm8k_ppo": ["type=ppo"],
    "current/gsm8k_sft": [],
    "current/hhrlhf_rw": [],
    "current/hhrlhf_dpo": [],
    "colon_style/gsm8k_grpo": ["type=grpo"],
    "dot_style/gsm8k_grpo": ["type=grpo"],
    "lite/gsm8k_grpo": ["type=grpo"],  # 2025-09: actor.fsdp.ulysses_sp_size and ref.fsdp.ulysses_sp_size
}


def _rows(path: Path, rows: list[dict[str, str]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.fixture(scope="module")
def model(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model, saying Qwen2.5's 32768 positions as the examples' server contexts ask (rotary positions: the
    files are the same model at any length)."""
    model = tmp_path_factory.mktemp("areal-model") / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "max_position_embeddings": 32768}))
    return model


@pytest.fixture
def site(tmp_path: Path, model: Path) -> dict[str, list[str]]:
    """The site overrides per kind of data: the tiny model, GSM8K-format or pair rows, a private fileroot."""
    gsm8k = _rows(tmp_path / "gsm8k.jsonl", GSM8K_ROWS)
    pairs = _rows(tmp_path / "pairs.jsonl", PAIR_ROWS)
    common = [f"actor.path={model}", f"cluster.fileroot={tmp_path / 'fileroot'}", *SITE]
    return {name: [*common, f"train_dataset.path={data}", f"valid_dataset.path={data}"]
            for name, data in (("gsm8k", gsm8k), ("pairs", pairs))}


@pytest.mark.parametrize("example", sorted(CASES))
def test_an_areal_example_renders_with_site_settings_only(example: str, site: dict[str, list[str]]) -> None:
    overrides = [*site["pairs" if "hhrlhf" in example else "gsm8k"], *CASES[example]]
    prepared = prepare(EXAMPLES / f"{example}.yaml", overrides, dry_run=True)
    assert prepared.script.startswith("#!/bin/bash"), "one job script"
    assert not prepared.warnings, [w.message for w in prepared.warnings]
    keys = [accepted.key for accepted in prepared.areal_keys]
    assert len(keys) == len(set(keys)) >= 20, "AReaL's plumbing is accepted and each key named once"
    assert {"experiment_name", "trial_name"} & {k.split(".")[-1] for k in keys}, keys
    if not CASES[example]:
        assert ("type", prepared.config.type) in [(a.key, a.value) for a in prepared.areal_keys]
    # the file's one node: servers and trainer share it, each step on its own GPUs (trainer-only files: one job)
    plan = prepared.plan
    assert prepared.config.cluster.n_nodes == 1 and [r.nodes for r in plan.requests] == [1]
    assert plan.packed == any(step.role == "server" for step in plan.steps)
    assert sum(step.gpus_per_node for step in plan.steps) <= 8


@pytest.mark.parametrize("example", ["current/gsm8k_grpo", "current/gsm8k_ppo", "colon_style/gsm8k_grpo",
                                     "dot_style/gsm8k_grpo"])
def test_areal_one_node_split_is_packed_on_its_node(example: str, site: dict[str, list[str]]) -> None:
    """AReaL's `sglang:d4p1t1+d4p1t1` on `n_nodes: 1`, `n_gpus_per_node: 8`: 4 servers of one GPU and a 4-rank
    trainer on node 0, the 8 GPUs split 4 + 4."""
    prepared = prepare(EXAMPLES / f"{example}.yaml", [*site["gsm8k"], *CASES[example]], dry_run=True)
    plan = prepared.plan
    assert plan.packed and plan.requests[0].nodes == 1 and plan.requests[0].gpus_per_node == 8
    assert [(s.role, s.relative_node, s.gpus_per_node, s.ntasks) for s in plan.steps] == [
        *[("server", 0, 1, 1)] * 4, ("trainer", 0, 4, 4)]
    assert "# placement: packed, one allocation of 1 node(s)" in prepared.script


def test_renaming_and_references_between_areal_keys(site: dict[str, list[str]]) -> None:
    """AReaL names rlkit reads elsewhere are used there (dpo's actor.beta, the older behave_imp_weight_cap); a
    reference to an AReaL-only key (`use_lora: ${rollout.use_lora}`) still resolves."""
    dpo = prepare(EXAMPLES / "current/hhrlhf_dpo.yaml", [*site["pairs"], "actor.beta=0.25"], dry_run=True)
    assert dpo.config.dpo.beta == 0.25
    older = prepare(EXAMPLES / "colon_style/gsm8k_grpo.yaml", [*site["gsm8k"], "type=grpo"], dry_run=True)
    assert older.config.actor.behav_imp_weight_cap == 5.0
    lora = prepare(EXAMPLES / "current/gsm8k_grpo_lora.yaml", [*site["gsm8k"], *CASES["current/gsm8k_grpo_lora"]],
                   dry_run=True)
    assert lora.config.actor.use_lora is True and lora.config.actor.lora_rank == 16


def test_the_render_prints_one_notice_and_the_refusals_exit_2_all_at_once(
        site: dict[str, list[str]], tmp_path: Path) -> None:
    example = str(EXAMPLES / "current/gsm8k_grpo_cpu.yaml")
    ok = run_rlkit("render", example, *site["gsm8k"], "type=grpo")
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr.count("AReaL key(s) that rlkit has no field for") == 1
    assert "rollout.enable_rollout_tracing: false" in ok.stderr and "#SBATCH" in ok.stdout
    bad = run_rlkit("render", example, *site["gsm8k"], "type=grpo", "allocation_mode=vllm:d2+fsdp:d1",
                    "rollout.experiment_name=another", "gconfig.use_beam_search=true")
    assert bad.returncode == 2, bad.stderr
    assert "Traceback" not in bad.stderr
    for named in ("allocation_mode 'vllm:d2+fsdp:d1'", "rollout.experiment_name: another",
                  "gconfig.use_beam_search: true"):
        assert named in bad.stderr, (named, bad.stderr)
    assert not (tmp_path / "fileroot").exists(), "nothing written"


@pytest.mark.parametrize("example", sorted(CASES))
def test_migrate_gives_a_clean_file_of_the_same_config(example: str, site: dict[str, list[str]],
                                                       tmp_path: Path) -> None:
    """`rlkit migrate`: the text loads with no AReaL key left to the very config the AReaL file gives, and its
    header names every AReaL key of the file."""
    from rlkit.config.areal.migrate import migrate
    from rlkit.config.load import to_yaml

    overrides = [*site["pairs" if "hhrlhf" in example else "gsm8k"], *CASES[example]]
    original = prepare(EXAMPLES / f"{example}.yaml", overrides, dry_run=True)
    text, _ = migrate(EXAMPLES / f"{example}.yaml", overrides, REGISTRY)
    clean = tmp_path / "clean.yaml"
    clean.write_text(text)
    migrated = prepare(clean, [], dry_run=True)
    assert to_yaml(migrated.config) == to_yaml(original.config)
    assert migrated.areal_keys == (), "nothing AReaL-only left"
    header = [line for line in text.splitlines() if line.startswith("#   ")]
    assert {a.key for a in original.areal_keys} <= {line.split(":")[0].strip("# ") for line in header}


def test_migrate_on_the_command_line(site: dict[str, list[str]]) -> None:
    done = run_rlkit("migrate", str(EXAMPLES / "current/hhrlhf_dpo.yaml"), *site["pairs"])
    assert done.returncode == 0, done.stderr
    assert "#   actor.beta: 0.1  -> moved to dpo.beta" in done.stdout
    assert "\ndpo:\n  beta: 0.1\n" in done.stdout and "allocation_mode: fsdp:d8p1t1" in done.stdout
    refused = run_rlkit("migrate", str(EXAMPLES / "current/gsm8k_grpo.yaml"), *site["gsm8k"])
    assert refused.returncode == 2 and "set type=grpo or type=ppo" in refused.stderr
    # render's checks run too: a layout render refuses (more GPUs than the nodes hold) is refused, nothing printed
    crowded = run_rlkit("migrate", str(EXAMPLES / "current/hhrlhf_dpo.yaml"), *site["pairs"], "cluster.n_nodes=1",
                        "cluster.n_gpus_per_node=4")
    assert crowded.returncode == 2 and "Traceback" not in crowded.stderr, crowded.stderr
    assert "n_nodes" in crowded.stderr and "dpo:" not in crowded.stdout, crowded.stderr


def test_greedy_is_a_field_an_areal_grpo_example_takes_for_its_evaluation(site: dict[str, list[str]]) -> None:
    """AReaL's gconfig.greedy (false in the examples) is an rlkit field: eval_gconfig.greedy renders and reaches the
    evaluation's requests; gconfig.greedy=true, for the rollouts a GRPO group trains on, exits 2 naming the fix."""
    from rlkit.trainer.evaluator import eval_sampling

    example = EXAMPLES / "current/gsm8k_grpo_cpu.yaml"
    prepared = prepare(example, [*site["gsm8k"], "type=grpo", "eval_gconfig.greedy=true", "eval_gconfig.n_samples=1"],
                       dry_run=True)
    assert prepared.config.gconfig.greedy is False and prepared.config.eval_gconfig.greedy is True
    assert "gconfig.greedy" not in {a.key for a in prepared.areal_keys}
    params = eval_sampling(prepared.config)
    assert (params.temperature, params.n) == (0.0, 1)
    bad = run_rlkit("render", str(example), *site["gsm8k"], "type=grpo", "gconfig.greedy=true")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr, bad.stderr
    assert "gconfig.greedy is true, but job type grpo trains on groups" in bad.stderr
    assert "set gconfig.greedy=false, or use eval_gconfig.greedy for evaluation" in bad.stderr


def test_an_older_model_section_is_read_as_the_actor(site: dict[str, list[str]], tmp_path: Path) -> None:
    """AReaL-lite's SFT files call the trained model's section `model:` (and refer to `${model.path}`): read as
    `actor:`, the same config as the current file, named once in the notice; both sections at once exit 2."""
    current = (EXAMPLES / "current/gsm8k_sft.yaml").read_text()
    assert "\nactor:\n" in current and "${actor.path}" in current
    older = tmp_path / "lite_sft.yaml"
    older.write_text(current.replace("\nactor:\n", "\nmodel:\n").replace("${actor.", "${model."))
    want = prepare(EXAMPLES / "current/gsm8k_sft.yaml", site["gsm8k"], dry_run=True)
    got = prepare(older, site["gsm8k"], dry_run=True)
    from rlkit.config.load import to_yaml

    assert to_yaml(got.config) == to_yaml(want.config)
    assert [a.key for a in got.areal_keys if a.key == "model"] == ["model"]
    both = tmp_path / "both.yaml"
    both.write_text(older.read_text() + "\nactor:\n  dtype: bfloat16\n")
    refused = run_rlkit("render", str(both), *site["gsm8k"])
    assert refused.returncode == 2 and "'model' (AReaL's older name of 'actor') and 'actor' are both given" in \
        refused.stderr, refused.stderr


@pytest.mark.parametrize(("older", "adv", "reward"), [
    # AReaL <= v0.3: adv_norm defaulted on, so group_adv_norm false meant batch-level normalisation
    ({"group_adv_norm": False}, ("batch", False, 1e-5), None),
    ({"group_adv_norm": True}, ("group", False, 1e-5), None),
    ({"adv_norm": False, "group_adv_norm": True}, None, None),
    ({"adv_norm": True, "group_reward_norm": True}, ("batch", False, 1e-5), ("group", True, 1e-9)),
    ({"group_reward_norm": False}, "unchanged", None),
])
def test_areals_older_norm_switches_keep_their_meaning(site: dict[str, list[str]], tmp_path: Path,
                                                       older: dict[str, bool], adv: Any, reward: Any) -> None:
    import yaml

    data = yaml.safe_load((EXAMPLES / "current/gsm8k_grpo_cpu.yaml").read_text())
    for name in ("adv_norm", "reward_norm"):
        data["actor"].pop(name)
    data["actor"].update(older)
    path = tmp_path / "older.yaml"
    path.write_text(yaml.safe_dump(data))
    got = prepare(path, [*site["gsm8k"], "type=grpo"], dry_run=True)
    for norm, want in ((got.config.actor.adv_norm, adv), (got.config.actor.reward_norm, reward)):
        if want == "unchanged":
            assert norm is None  # rlkit's default: off
        elif want is None:
            assert norm is None
        else:
            assert (norm.mean_level, norm.std_level, norm.std_unbiased, norm.eps) == (want[0], want[0], *want[1:])
    named = {a.key for a in got.areal_keys}
    assert {f"actor.{k}" for k in older if k != "adv_norm" or len(older) == 1} <= named, named
    # the same switch as an override wins over the file's
    flipped = prepare(path, [*site["gsm8k"], "type=grpo", "actor.group_adv_norm=true"], dry_run=True)
    if older.get("adv_norm", True):
        assert flipped.config.actor.adv_norm is not None and flipped.config.actor.adv_norm.mean_level == "group"
