"""Bad input through the real CLI: exit code 2, one clear message, no traceback, nothing written or submitted."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import grpo_as_sft, run_rlkit
from tests.helpers.slurm_helpers import job_ids_under

# the dev cluster's controller (squeue: nothing may change in Slurm; no job runs). Most of the module runs in the
# cluster lane, the cases marked `controller` in the local lane (the lanes end together); either way a test looks only
# for jobs of its own (scripts under its tmp_path: another test's job of `test-exp` ending mid-test looked like one of
# ours when the check was by job name, CI stop 39)
pytestmark = [pytest.mark.slurm]


def _test_jobs(tmp_path: Path) -> set[str]:
    """Ids of the jobs (any state) whose batch script is under the test's own tmp_path (its fileroot): the jobs a
    refused submit of this test could have made, whatever other tests submit meanwhile."""
    return job_ids_under(tmp_path)


def _assert_refused(result: subprocess.CompletedProcess[str], says: str) -> None:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("error:") == 1, result.stderr
    assert says in result.stderr, result.stderr


def assert_refused_whole(result: subprocess.CompletedProcess[str], says: list[str], tmp_path: Path,
                         rlkit_home: Path) -> None:
    """Exit 2 without a traceback, exactly one `error:` line per expected text, and nothing written: no trial
    directory under tmp_path/fileroot, no trial index."""
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == len(says) and all(any(s in e for e in errors) for s in says), result.stderr
    assert not (tmp_path / "fileroot").exists(), "a refused submit must not write the trial directory"
    assert not rlkit_home.exists(), "a refused submit must not touch the trial index"


MISTAKES = [
    pytest.param(["cluster.n_node=3"], "did you mean 'cluster.n_nodes'", id="unknown-key"),
    pytest.param(["cluster.n_nodes=lots"], "wrong type for 'cluster.n_nodes'", id="wrong-type"),
    pytest.param(["n_nodes"], "is not of the form key.path=value", id="malformed-override"),
    pytest.param(["experiment_name=-exp"], "experiment_name '-exp' is not allowed", id="experiment-leading-dash"),
    pytest.param(["trial_name=.run"], "trial_name '.run' is not allowed", id="trial-leading-dot"),
    pytest.param(["allocation_mode=vllm:d4"], "needs 4 nodes of 1 GPU", id="does-not-fit"),  # even packed
    pytest.param(["allocation_mode=vllm:d1t9", "cluster.n_gpus_per_node=8"], "one server needs 9 GPUs but a node has 8",
                 id="server-over-a-node"),  # a server that does not divide a node is packed beside the others
    pytest.param(["allocation_mode=vllm:x2"], "vllm takes only d, t (got 'x')", id="bad-grammar"),
    pytest.param(["launcher.slurm.container_type=apptainer", "launcher.slurm.inference_server_image=/no/s.sif",
                  "launcher.slurm.trainer_image=docker://ghcr.io/x/t:1"], "image file '/no/s.sif' does not exist",
                 id="missing-image"),
    pytest.param(["generate.dataset.path=/no/data.jsonl"], "'/no/data.jsonl' does not exist", id="missing-dataset"),
    pytest.param(["actor.path=/no/model"], "is not a model directory", id="missing-model"),
    pytest.param(["launcher.slurm.time=tomorrow"], "is not a Slurm time", id="bad-time"),
    pytest.param(["launcher.trainer_env_vars=NOEQUALS"], "is not NAME=VALUE", id="bad-env"),
    pytest.param(["launcher.slurm.constraint=nosuchfeature"], "Slurm rejects this job", id="slurm-rejects"),
    pytest.param(["launcher.slurm.partition=nosuchpartition"], "is not a partition of this cluster",
                 id="unknown-partition"),
    pytest.param(["launcher.slurm.constraint=a100 && h100"], "launcher.slurm.constraint 'a100 && h100' is not",
                 id="constraint-with-spaces"),
    pytest.param(["actor.path=~/models/qwen"], "actor.path '~/models/qwen' starts with '~'", id="tilde-path"),
    pytest.param(["generate.output_file=logs/out.jsonl"], "would overwrite rlkit's own 'logs'",
                 id="output-over-logs"),
    pytest.param(["generate.output_file="], "generate.output_file is empty", id="output-empty"),
    pytest.param(["generate.output_file=."], "generate.output_file '.' must name a file", id="output-dot"),
    pytest.param(["generate.output_file=attempt-1"], "would overwrite rlkit's own 'attempt-1'",
                 id="output-over-archive"),
    pytest.param(["generate.dataset.path=/tmp/" + "d" * 300], "cannot be checked here: File name too long",
                 id="dataset-name-too-long"),
    pytest.param(["cluster.name_resolve.type=etcd3", "cluster.name_resolve.etcd3_user=me"],
                 "etcd3_user is set but etcd is reached over plain http", id="etcd-password-in-clear"),
    pytest.param(["vllm.max_model_len=64", "gconfig.max_new_tokens=64"], "leaves no room for a prompt",
                 id="completion-longer-than-context"),
    pytest.param(["trial_name=" + "t" * 65], "at most 64 are allowed", id="trial-name-too-long"),
    pytest.param(["valid_dataset.path=/data/valid.jsonl"], "valid_dataset.path is set, but", id="inert-valid-set"),
    pytest.param(["cluster.name_resolve.nfs_record_root=/shared/a,b"], "nfs_record_root '/shared/a,b' has",
                 id="record-root-with-comma"),
    pytest.param(["vllm.extra_args.grpc_port=50051"], "vllm.extra_args.grpc_port: --grpc-port is refused",
                 id="server-listener-flag"),
    pytest.param(["vllm.extra_args.no_such_vllm_flag=1"], "vllm.extra_args.no_such_vllm_flag", id="unknown-vllm-flag"),
    pytest.param(["launcher.slurm.srun_additional_args=--chd=/tmp"], "rlkit sets --chd itself",
                 id="srun-chdir-abbreviated"),
    pytest.param(["cluster.name_resolve.type=etcd3", "cluster.name_resolve.etcd3_addr=etcd01"],
                 "etcd3_addr: address 'etcd01' is not host:port", id="etcd-address-without-port"),
    pytest.param(["cluster.name_resolve.type=etcd3", "cluster.name_resolve.etcd3_cert=/etc/hostname"],
                 "etcd3_cert and etcd3_key go together", id="etcd-cert-without-key"),
]


@pytest.mark.slurm
@pytest.mark.parametrize(("overrides", "says"), MISTAKES)
def test_bad_submit_changes_nothing(generate_yaml: Path, rlkit_home: Path, tmp_path: Path, overrides: list[str],
                                    says: str) -> None:
    before = _test_jobs(tmp_path)
    # a password in the environment, so an etcd mistake is the only problem
    _assert_refused(run_rlkit("submit", str(generate_yaml), *overrides, env={"ETCDCTL_PASSWORD": "pw"}), says)
    assert not (tmp_path / "fileroot").exists(), "a refused submit must not write the trial directory"
    assert not rlkit_home.exists(), "a refused submit must not touch the trial index"
    assert _test_jobs(tmp_path) == before


TRAINING_MISTAKES = [
    pytest.param(["launcher.slurm.time=5"], "not longer than recover.time_limit_warning", id="time-under-warning"),
    pytest.param(["train_dataset.path=/no/train.jsonl"], "train_dataset.path: '/no/train.jsonl' does not exist",
                 id="missing-dataset"),
    pytest.param(["reward.fn=no_such_reward"], "is not a built-in reward", id="unknown-builtin-reward"),
    pytest.param(["reward.fn=no_such_module.sub:score"], "no_such_module", id="reward-module-missing"),
    pytest.param(["reward.fn=rlkit.tasks.digits:no_such_fn"], "no_such_fn", id="reward-function-missing"),
    pytest.param(["gconfig.n_samples=1", "actor.group_size=1", "actor.reward_norm.mean_level=group"],
                 "actor.reward_norm.mean_level group with groups of 1 sample", id="group-of-one"),
    pytest.param(["actor.ppo_n_minibatches=5"], "does not split into actor.ppo_n_minibatches=5",
                 id="batch-not-divisible"),
    pytest.param(["actor.group_size=8"], "actor.group_size (8) differs from gconfig.n_samples (4)",
                 id="group-size-mismatch"),
    pytest.param(["actor.optimizer.lr_scheduler_type=warmup"], "lr_scheduler_type 'warmup' is not one of",
                 id="bad-scheduler"),
    pytest.param(["stats_logger.swanlab.mode=online"], "stats_logger.swanlab.mode", id="bad-swanlab-mode"),
    pytest.param(["train_dataset.prompt_key=question"], "no column 'question'", id="missing-prompt-column"),
    pytest.param(["gconfig.temperature=0"], "must be > 0", id="greedy-grpo"),
    pytest.param(["rollout.consumer_batch_size=3"], "rollout.consumer_batch_size (3) differs", id="inert-consumer"),
    pytest.param(["actor.weight_update_mode=nccl"], "actor.weight_update_mode 'nccl' is not one of: disk, xccl",
                 id="unknown-weight-update-mode"),
    pytest.param(["actor.weight_update_mode=xccl", "actor.weight_chunked_mem_mb=0"],
                 "actor.weight_chunked_mem_mb must be at least 1", id="empty-broadcast-bucket"),
    pytest.param(["actor.weight_update_timeout=0"], "actor.weight_update_timeout must be positive", id="no-timeout"),
    pytest.param(["vllm.extra_args.weight_transfer_config={backend: nccl}"], "rlkit sets it from "
                 "actor.weight_update_mode", id="own-weight-transfer-config"),
    # LoRA (rlkit.checks.lora, called from the grpo validation)
    pytest.param(["actor.use_lora=true"], "actor.target_modules is empty", id="lora-without-modules"),
    pytest.param(["actor.use_lora=true", "actor.target_modules=[q_proj]", "actor.weight_update_mode=xccl"],
                 "adapters go to the servers by disk only", id="lora-by-broadcast"),
    pytest.param(["actor.use_lora=true", "actor.target_modules=[q_proj]", "actor.lora_rank=600"],
                 "above the largest rank vLLM serves", id="lora-rank-too-large"),
    # delta pushes (rlkit.checks.weight_delta)
    pytest.param(["allocation_mode=sglang:d1+fsdp:d2", "actor.weight_update_delta=true"],
                 "only vLLM servers apply deltas", id="delta-to-sglang"),
    pytest.param(["actor.use_lora=true", "actor.target_modules=[q_proj]", "actor.weight_update_delta=true"],
                 "never the weights a delta applies to", id="delta-with-lora"),
]


@pytest.mark.slurm
@pytest.mark.controller
@pytest.mark.parametrize(("overrides", "says"), TRAINING_MISTAKES)
def test_bad_training_config_changes_nothing(grpo_yaml: Path, rlkit_home: Path, tmp_path: Path,
                                             overrides: list[str], says: str) -> None:
    before = _test_jobs(tmp_path)
    _assert_refused(run_rlkit("submit", str(grpo_yaml), *overrides), says)
    assert not (tmp_path / "fileroot").exists(), "a refused submit must not write the trial directory"
    assert not rlkit_home.exists(), "a refused submit must not touch the trial index"
    assert _test_jobs(tmp_path) == before


@pytest.mark.slurm
def test_every_problem_is_listed_at_once(grpo_yaml: Path, rlkit_home: Path, tmp_path: Path) -> None:
    """Schema, value, site-file and training mistakes of one config come back together, one `error:` each."""
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(grpo_yaml), "cluster.n_node=3", "trial_name=.run", "launcher.slurm.time=soon",
                       "train_dataset.path=/no/train.jsonl", "actor.ppo_n_minibatches=5", "gconfig.temperature=0")
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    for says in ("unknown key 'cluster.n_node'", "trial_name '.run' is not allowed", "'soon' is not a Slurm time",
                 "train_dataset.path: '/no/train.jsonl' does not exist", "ppo_n_minibatches=5",
                 "gconfig.temperature 0"):
        assert says in result.stderr, (says, result.stderr)
    assert result.stderr.count("error:") == 6, result.stderr
    assert "6 problems; nothing was written or submitted" in result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists()
    assert _test_jobs(tmp_path) == before


def test_control_characters_in_the_yaml_file_are_refused(generate_yaml: Path, rlkit_home: Path,
                                                         tmp_path: Path) -> None:
    """A newline that would start a command after `#SBATCH`: refused for each field, naming it."""
    text = generate_yaml.read_text().replace("slurm: {container_type: none}",
                                             'slurm: {container_type: none, partition: "debug\\nhostname", '
                                             'qos: "normal\\r"}')
    bad = tmp_path / "newline.yaml"
    bad.write_text(text)
    result = run_rlkit("render", str(bad))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "launcher.slurm.partition holds control characters (\\n)" in result.stderr, result.stderr
    assert "launcher.slurm.qos holds control characters (\\r)" in result.stderr, result.stderr
    assert result.stdout == "", "nothing is rendered from a refused config"


def test_render_is_a_dry_run_without_site_files(generate_yaml: Path, rlkit_home: Path, tmp_path: Path) -> None:
    """Missing site files: render prints the script and warns; --strict and submit refuse."""
    args = ("launcher.slurm.container_type=apptainer", "launcher.slurm.inference_server_image=/no/s.sif",
            "launcher.slurm.trainer_image=/no/t.sif", "actor.path=/no/model")
    result = run_rlkit("render", str(generate_yaml), *args)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash") and "apptainer exec" in result.stdout
    assert result.stderr.count("warning:") == 3, result.stderr
    assert "image file '/no/s.sif' does not exist" in result.stderr and "'/no/model' is not a model" in result.stderr
    strict = run_rlkit("render", "--strict", str(generate_yaml), *args)
    assert strict.returncode == 2 and strict.stdout == "" and strict.stderr.count("error:") == 3, strict.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists()


@pytest.mark.slurm
def test_model_without_tokenizer_is_refused(grpo_yaml: Path, fake_model: Path, rlkit_home: Path,
                                            tmp_path: Path) -> None:
    (fake_model / "tokenizer.json").unlink()
    _assert_refused(run_rlkit("submit", str(grpo_yaml)), "has no tokenizer")
    assert not (tmp_path / "fileroot").exists()


def test_valid_training_config_renders(grpo_yaml: Path, rlkit_home: Path) -> None:
    """The fixture itself is valid, so each mistake above is refused for its own reason."""
    result = run_rlkit("render", str(grpo_yaml))
    assert result.returncode == 0, result.stderr
    assert "rlkit train --trial-dir" in result.stdout


def test_missing_and_invalid_config_files(tmp_path: Path, rlkit_home: Path) -> None:
    _assert_refused(run_rlkit("submit", str(tmp_path / "nope.yaml")), "does not exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment_name: [unclosed\n")
    _assert_refused(run_rlkit("render", str(bad)), "is not valid YAML at line")


def test_unknown_trial_for_status_stop_logs(rlkit_home: Path) -> None:
    for command in (["status", "nosuch"], ["stop", "nosuch"], ["logs", "nosuch"]):
        _assert_refused(run_rlkit(*command), "no trial 'nosuch'")


@pytest.mark.slurm
def test_existing_trial_is_refused_without_force(generate_yaml: Path, rlkit_home: Path, tmp_path: Path) -> None:
    trial_dir = tmp_path / "fileroot" / "test-exp" / "t1"
    trial_dir.mkdir(parents=True)
    (trial_dir / "config.yaml").write_text("kept: true\n")
    _assert_refused(run_rlkit("submit", str(generate_yaml)), "already exists")
    assert (trial_dir / "config.yaml").read_text() == "kept: true\n"
    assert sorted(p.name for p in trial_dir.iterdir()) == ["config.yaml"]


def test_render_writes_nothing(generate_yaml: Path, rlkit_home: Path, tmp_path: Path) -> None:
    result = run_rlkit("render", str(generate_yaml))
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("#!/bin/bash") and "#SBATCH hetjob" in result.stdout
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists()


def _previous_run(trial_dir: Path) -> list[str]:
    """A trial directory as a finished run leaves it (config, recover checkpoint, saver checkpoint, metrics)."""
    for name in ("recover/step-00000004", "checkpoints/step4", "logs", "secret"):
        (trial_dir / name).mkdir(parents=True)
    (trial_dir / "config.yaml").write_text("kept: true\n")
    (trial_dir / "metrics.jsonl").write_text('{"step": 1}\n')
    return sorted(str(p.relative_to(trial_dir)) for p in trial_dir.rglob("*"))


@pytest.mark.slurm
@pytest.mark.parametrize(("config", "overrides", "says"), [
    pytest.param("generate", ["launcher.slurm.constraint=nosuchfeature"], "Slurm rejects this job",
                 id="slurm-rejects"),
    pytest.param("grpo", ["recover.mode=resume"], "--force starts a new run", id="force-with-resume-mode"),
])
def test_force_moves_nothing_until_every_check_passed(generate_yaml: Path, grpo_yaml: Path, rlkit_home: Path,
                                                      tmp_path: Path, config: str, overrides: list[str],
                                                      says: str) -> None:
    trial_dir = tmp_path / "fileroot" / "test-exp" / "t1"
    before = _previous_run(trial_dir)
    if config == "grpo":  # a valid-looking checkpoint, so that recover.mode=resume passes its own check
        step = trial_dir / "recover" / "step-00000004"
        (step / "trainer_state.json").write_text("{}")
        (step / "MANIFEST.json").write_text('{"files": []}')
        before = sorted(str(p.relative_to(trial_dir)) for p in trial_dir.rglob("*"))
    jobs = _test_jobs(tmp_path)
    yaml = generate_yaml if config == "generate" else grpo_yaml
    _assert_refused(run_rlkit("submit", str(yaml), *overrides, "--force"), says)
    assert sorted(str(p.relative_to(trial_dir)) for p in trial_dir.rglob("*")) == before, "nothing may move"
    assert (trial_dir / "config.yaml").read_text() == "kept: true\n"
    assert _test_jobs(tmp_path) == jobs


def test_xccl_refuses_a_container_network_the_servers_cannot_leave(grpo_yaml: Path, rlkit_home: Path,
                                                                   tmp_path: Path) -> None:
    """A dry run (images need not exist): the network option is an error of its own, named with its fix."""
    common = ["launcher.slurm.container_type=apptainer", f"launcher.slurm.trainer_image={tmp_path}/t.sif",
              f"launcher.slurm.inference_server_image={tmp_path}/s.sif"]
    isolated = run_rlkit("render", str(grpo_yaml), *common, "actor.weight_update_mode=xccl",
                         "launcher.slurm.apptainer_args=--nv --network=none")
    _assert_refused(isolated, "apptainer_args has --network=none, which gives each step its own network namespace")
    assert "use actor.weight_update_mode=disk" in isolated.stderr
    shared = run_rlkit("render", str(grpo_yaml), *common, "actor.weight_update_mode=xccl",
                       "launcher.slurm.apptainer_args=--nv")
    assert shared.returncode == 0, shared.stderr


@pytest.fixture
def sft_yaml(grpo_yaml: Path) -> Path:
    """The grpo fixture as a valid trainer-only sft job (allocation_mode fsdp:d2, sft rows)."""
    data = grpo_yaml.with_name("sft.jsonl")
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(8)))
    path = grpo_yaml.with_name("sft.yaml")
    path.write_text(grpo_as_sft(grpo_yaml.read_text(), data)
                    + "sft: {apply_chat_template: false}\n")  # text rows; the stand-in tokenizer has no template
    return path


SFT_MISTAKES = [
    pytest.param(["allocation_mode=vllm:d1+fsdp:d2"], ["job type sft runs no inference servers"], id="servers"),
    pytest.param(["allocation_mode=sglang:d2"], ["job type sft runs no inference servers",
                                                 "job type sft needs trainer GPUs"], id="no-trainer-part"),
    pytest.param(["allocation_mode=fsdp:d2t2"], ["'t2' in 'fsdp:d2t2': the FSDP trainer shards over its d ranks only"],
                 id="tensor-parallel-trainer"),
    pytest.param(["actor.path=/no/model"], ["actor.path: '/no/model' is not a model directory",
                                            "actor.path: '/no/model' has no tokenizer"], id="missing-model"),
    pytest.param(["allocation_mode=fsdp:d4"], ["needs 4 nodes of 1 GPU (4 trainer GPUs, placed 1, 1, 1, 1 per node) "
                                               "but cluster.n_nodes is 3"],
                 id="does-not-fit"),
    pytest.param(["type=sfft"], ["type 'sfft' is not a job type", "did you mean 'sft'?"], id="misspelt-type"),
]


@pytest.mark.slurm
@pytest.mark.parametrize(("overrides", "says"), SFT_MISTAKES)
def test_bad_sft_config_changes_nothing(sft_yaml: Path, rlkit_home: Path, tmp_path: Path, overrides: list[str],
                                        says: list[str]) -> None:
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(sft_yaml), *overrides)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    if "did you mean 'sft'?" in says:
        says = says[:1]  # the hint is on the fix line
        assert "did you mean 'sft'?" in result.stderr
    assert len(errors) == len(says) and all(any(s in e for e in errors) for s in says), result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists()
    assert _test_jobs(tmp_path) == before


@pytest.fixture
def pairs_yaml(sft_yaml: Path) -> Path:
    """The sft fixture as a pair job (`type` set by the test): a jsonl of text pairs."""
    data = sft_yaml.with_name("pairs.jsonl")
    data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "chosen": str(i + 1), "rejected": "x"}) + "\n"
                            for i in range(8)))
    path = sft_yaml.with_name("pairs.yaml")
    path.write_text(re.sub(r"train_dataset: \{path: [^,]+, type: sft,", f"train_dataset: {{path: {data},",
                           sft_yaml.read_text()).replace("sft: {apply_chat_template: false}\n", ""))
    return path


PAIR_MISTAKES = [
    pytest.param("rw", ["rw.chosen_key=better"], ["rows have no column 'better'"], id="rw-no-column"),
    pytest.param("rw", ["rw.rejected_key=chosen"], ["rw.chosen_key and rw.rejected_key are both 'chosen'"],
                 id="rw-same-column"),
    pytest.param("rw", ["allocation_mode=vllm:d1+fsdp:d2"], ["job type rw runs no inference servers"],
                 id="rw-servers"),
    pytest.param("dpo", ["dpo.beta=0"], ["dpo.beta must be positive"], id="dpo-beta"),
    pytest.param("dpo", ["dpo.loss_type=ipo"], ["dpo.loss_type 'ipo' is not one of"], id="dpo-loss-type"),
    pytest.param("dpo", ["dpo.label_smoothing=0.5", "dpo.ref_path=/no/ref"],
                 ["dpo.label_smoothing must be in [0, 0.5)", "dpo.ref_path: '/no/ref' is not a model directory"],
                 id="dpo-two-at-once"),
]


@pytest.mark.slurm
@pytest.mark.parametrize(("job", "overrides", "says"), PAIR_MISTAKES)
def test_bad_rw_and_dpo_configs_change_nothing(pairs_yaml: Path, rlkit_home: Path, tmp_path: Path, job: str,
                                               overrides: list[str], says: list[str]) -> None:
    assert run_rlkit("render", str(pairs_yaml), f"type={job}").returncode == 0, "the fixture itself is valid"
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(pairs_yaml), f"type={job}", *overrides)
    assert_refused_whole(result, says, tmp_path, rlkit_home)
    assert _test_jobs(tmp_path) == before


@pytest.mark.slurm
def test_a_bad_multi_stage_config_is_refused_whole_and_changes_nothing(sft_yaml: Path, rlkit_home: Path,
                                                                       tmp_path: Path) -> None:
    """Every problem of every stage at once, each naming its stage; no trial written, no job submitted (not even
    for the stages that are fine)."""
    import yaml

    data = yaml.safe_load(sft_yaml.read_text())
    sft = {"stage_name": "warmup", "type": "sft", "allocation_mode": "fsdp:d2"}
    staged = {**{k: v for k, v in data.items() if k not in ("type", "allocation_mode")},
              "stages": [sft, {"type": "rw"}, {**sft, "stage_name": "gen", "type": "generate"},
                         {**sft, "stage_name": "again", "actor": {"optimizer": {"lr": -1}}}]}
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(staged))
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(path), "stages.warmup.seed=x", "stages.none.seed=1")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    for says in ("stages[1] has no stage_name", "stage gen is a generate job, which trains nothing to pass on",
                 "override 'stages.none.seed=1' names no stage of this run", "stage warmup: wrong type for 'seed'",
                 "stage again: actor.optimizer.lr"):
        assert says in result.stderr, (says, result.stderr)
    assert "5 problems; nothing was written or submitted" in result.stderr, result.stderr
    assert not (tmp_path / "fileroot").exists() and not rlkit_home.exists()
    assert _test_jobs(tmp_path) == before


def test_sft_renders_as_one_trainer_component(sft_yaml: Path) -> None:
    """A valid sft config renders as a plain one-component job (submitting it: tests/integration/test_stages_e2e.py)."""
    rendered = run_rlkit("render", str(sft_yaml))
    assert rendered.returncode == 0, rendered.stderr
    assert "#SBATCH hetjob" not in rendered.stdout and "rlkit train --trial-dir" in rendered.stdout

@pytest.fixture
def ppo_yaml(grpo_yaml: Path) -> Path:
    """The grpo fixture as a ppo job (a critic from actor.path; 4 prompts x 4 samples = 16 sequences, 2 ranks)."""
    path = grpo_yaml.with_name("ppo.yaml")
    path.write_text(grpo_yaml.read_text().replace("type: grpo", "type: ppo"))
    return path


PPO_MISTAKES = [
    pytest.param(["critic.eps_clip=0"], ["critic.eps_clip must be positive"], id="no-value-clip"),
    pytest.param(["actor.gae_lambda=1.5"], ["actor.gae_lambda must be between 0 and 1"], id="gae-lambda-above-1"),
    pytest.param(["actor.discount=-0.1"], ["actor.discount must be between 0 and 1"], id="negative-discount"),
    pytest.param(["critic.path=/no/critic"], ["critic.path: '/no/critic' is not a model directory"],
                 id="missing-critic-model"),
    pytest.param(["critic.ppo_n_minibatches=3"], ["does not split into critic.ppo_n_minibatches=3"],
                 id="uneven-critic-minibatches"),
    pytest.param(["critic.ppo_n_minibatches=16"], ["16 sequences per step are fewer than 2 trainer ranks x "
                                                   "critic.ppo_n_minibatches=16"], id="idle-critic-rank"),
    pytest.param(["critic.optimizer.lr=0", "actor.adv_norm.mean_level=prompt"],
                 ["critic.optimizer.lr must be positive", "actor.adv_norm.mean_level"], id="two-at-once"),
]


@pytest.mark.slurm
@pytest.mark.controller
@pytest.mark.parametrize(("overrides", "says"), PPO_MISTAKES)
def test_bad_ppo_config_changes_nothing(ppo_yaml: Path, rlkit_home: Path, tmp_path: Path, overrides: list[str],
                                        says: list[str]) -> None:
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(ppo_yaml), *overrides)
    assert_refused_whole(result, says, tmp_path, rlkit_home)
    assert _test_jobs(tmp_path) == before


@pytest.mark.slurm
def test_valid_ppo_config_renders(ppo_yaml: Path, rlkit_home: Path) -> None:
    result = run_rlkit("render", str(ppo_yaml))
    assert result.returncode == 0, result.stderr
    assert "job type ppo:" in result.stdout and "rlkit.jobs.ppo.algorithm" not in result.stderr


@pytest.fixture
def model_with_weights(fake_model: Path) -> Path:
    """The stand-in model with a safetensors header naming a Qwen-like layer's weights (the LoRA target check reads
    only the header; the weights are never loaded at submit)."""
    import struct

    names = [f"model.layers.0.{m}.weight" for m in ("self_attn.q_proj", "self_attn.v_proj", "mlp.down_proj")]
    header = json.dumps({n: {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]}
                         for i, n in enumerate(names)}).encode()
    (fake_model / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(4 * len(names)))
    return fake_model


LORA = ["actor.use_lora=true", "actor.target_modules=[q_proj,v_proj]"]
LORA_MISTAKES = [
    pytest.param("rw", LORA, ["actor.use_lora is set, but job type rw trains a reward model: a scalar value head"],
                 id="rw-with-lora"),
    pytest.param("sft", [*LORA, "actor.lora_rank=0"], ["actor.lora_rank must be at least 1 (got 0)"],
                 id="sft-lora-rank-zero"),
    pytest.param("dpo", [*LORA, "actor.target_modules=[q_proj,qkv_proj]"],
                 ["actor.target_modules: qkv_proj is not a module of the model at"], id="dpo-lora-unknown-module"),
]


@pytest.mark.slurm
@pytest.mark.controller
@pytest.mark.parametrize(("job", "overrides", "says"), LORA_MISTAKES)
def test_bad_lora_configs_of_trainer_only_jobs_change_nothing(pairs_yaml: Path, sft_yaml: Path,
                                                              model_with_weights: Path, rlkit_home: Path,
                                                              tmp_path: Path, job: str, overrides: list[str],
                                                              says: list[str]) -> None:
    yaml = sft_yaml if job == "sft" else pairs_yaml
    # the same config with a sound LoRA section is valid: a trainer-only job takes what a server could not serve
    # (a rank above vLLM's 512), since only merged checkpoints leave it (it pushes no weights: a
    # weight_update_mode would be ignored, refused by rlkit.checks.unread_knobs)
    valid = [f"type={job}", *LORA, "actor.lora_rank=600"]
    if job != "rw":
        assert run_rlkit("render", str(yaml), *valid).returncode == 0, "the LoRA fixture itself is valid"
    before = _test_jobs(tmp_path)
    result = run_rlkit("submit", str(yaml), f"type={job}", *overrides)
    assert_refused_whole(result, says, tmp_path, rlkit_home)
    assert _test_jobs(tmp_path) == before
