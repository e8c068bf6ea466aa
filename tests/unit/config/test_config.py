from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlkit.checks.binds import parse_mounts
from rlkit.config.load import load_config, schema_paths, to_yaml
from rlkit.errors import ConfigError
from rlkit.servers.engine_env import parse_env_vars
from tests.conftest import raise_problems


def test_loads_yaml_with_overrides_and_env(generate_yaml: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLKIT_TEST_PART", "eu")
    config = load_config(generate_yaml, ["cluster.n_nodes=4", "launcher.slurm.partition=gpu-${oc.env:RLKIT_TEST_PART}",
                                         "vllm.extra_args.max_num_batched_tokens=4", "gconfig.stop=[a,b]"])
    assert config.cluster.n_nodes == 4
    assert config.launcher.slurm.partition == "gpu-eu"
    assert config.vllm.extra_args == {"max_num_batched_tokens": 4}
    assert config.gconfig.stop == ["a", "b"]
    # no name-resolve root by default: the records live in the (private) trial directory
    assert config.cluster.name_resolve.nfs_record_root == ""
    raise_problems(config)


def test_resolved_yaml_round_trips(generate_yaml: Path, tmp_path: Path) -> None:
    config = load_config(generate_yaml, ["seed=7"])
    saved = tmp_path / "resolved.yaml"
    saved.write_text(to_yaml(config))
    assert load_config(saved) == config


@pytest.mark.parametrize(
    ("override", "message", "hint"),
    [
        ("cluster.n_node=3", "unknown key 'cluster.n_node'", "did you mean 'cluster.n_nodes'"),
        ("n_gpus_per_node=3", "unknown key 'n_gpus_per_node'", "did you mean 'cluster.n_gpus_per_node'"),
        ("launcher.slurm.partiton=x", "unknown key 'launcher.slurm.partiton'", "launcher.slurm.partition"),
        ("cluster.n_nodes=many", "wrong type for 'cluster.n_nodes'", None),
        ("launcher.slurm=3", "launcher.slurm", None),
        ("trial_name=${oc.env:RLKIT_SURELY_UNSET_VAR}", "cannot resolve 'trial_name'",
         "export RLKIT_SURELY_UNSET_VAR before running rlkit"),
        ("trial_name=${cluster.no_such_key}", "cannot resolve 'trial_name'",
         "'cluster.no_such_key' is no key of this config: set it, or write the value in place"),
        ("notakeyvalue", "is not of the form key.path=value", "cluster.n_nodes=4"),
        # an escaped reference resolves to the text ${HOME}, which the next reader took for a reference (a traceback)
        ("trial_name=\\${HOME}", "trial_name holds an escaped reference", "write trial_name's value in full"),
        ("rollout.agent.tools=[a, '\\${x}']", "rollout.agent.tools[1] holds an escaped reference", None),
        ("gconfig.stop=[[1]]", "wrong type for 'gconfig.stop[0]' (in a command-line override): a string is expected, "
                               "not a list ([1])", "give gconfig.stop as a list of strings, e.g. gconfig.stop=[a, b]"),
        ("eval_gconfig.stop=[a,{x: 1}]", "wrong type for 'eval_gconfig.stop[1]' (in a command-line override): a "
                                         "string is expected, not a mapping ({'x': 1})", "eval_gconfig.stop=[a, b]"),
        ("rollout.agent.tools=[{a: 1}]", "wrong type for 'rollout.agent.tools[0]'", "a list of strings"),
        # OmegaConf would make them "1", "true", "0.5": a stop at the first "1" of every answer
        ("gconfig.stop=[1]", "wrong type for 'gconfig.stop[0]' (in a command-line override): a stop string is text, "
                             "not the int 1", "quote it if the text is meant, e.g. gconfig.stop=['1']"),
        ("gconfig.stop=[a, true]", "'gconfig.stop[1]' (in a command-line override): a stop string is text, not the "
                                   "bool True", "e.g. gconfig.stop=['true']"),
        ("eval_gconfig.stop=[0.5]", "'eval_gconfig.stop[0]' (in a command-line override): a stop string is text, "
                                    "not the float 0.5", "eval_gconfig.stop=['0.5']"),
    ],
)
def test_bad_overrides_name_the_field(generate_yaml: Path, override: str, message: str, hint: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(generate_yaml, [override])
    assert message in info.value.message
    if hint:
        assert info.value.hint and hint in info.value.hint


def test_a_list_in_a_list_of_strings_is_refused_in_the_file_too(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("experiment_name: e\ntrial_name: t\nallocation_mode: vllm:d1\ngconfig:\n  stop: [x, [1]]\n")
    with pytest.raises(ConfigError, match=rf"wrong type for 'gconfig.stop\[1\]' \(in {path}\): a string is expected"):
        load_config(path)


def test_quoted_numbers_stay_stop_strings_and_a_program_argv_keeps_its_numbers(generate_yaml: Path) -> None:
    """Only stop lists refuse a number: quoted it is text, and elsewhere the conversion is what was meant."""
    config = load_config(generate_yaml, ["gconfig.stop=['1', '</answer>']", "rollout.agent.openai.command=[p.py, 4]"])
    assert config.gconfig.stop == ["1", "</answer>"]
    assert config.rollout.agent.openai.command == ["p.py", "4"]


def test_missing_required_field(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("experiment_name: e\ntrial_name: t\n")
    with pytest.raises(ConfigError, match="required field 'allocation_mode' is not set"):
        load_config(path)


def test_invalid_yaml_says_where(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("experiment_name: e\n  trial_name: [\n")
    with pytest.raises(ConfigError, match=r"not valid YAML at line \d+"):
        load_config(path)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("experiment_name=-exp", "experiment_name '-exp' is not allowed"),
        ("trial_name=.run", "trial_name '.run' is not allowed"),
        ("trial_name=a/b", "trial_name 'a/b' is not allowed"),
        ("type=ppx", "type 'ppx' is not a job type"),
        ("cluster.fileroot=relative/dir", "must be an absolute path"),
        ("launcher.slurm.time=two-days", "is not a Slurm time"),
        ("launcher.trainer_env_vars=A=1,oops", "'oops' is not NAME=VALUE"),
        ("launcher.slurm.mount=/a:/b", "launcher.slurm.mount is set, but launcher.slurm.container_type is none"),
        ("launcher.slurm.container_type=docker", "container_type 'docker' is not supported"),
        ("launcher.slurm.container_type=apptainer", "inference_server_image is empty"),
        ("generate.dataset.path=/nonexistent/p.jsonl", "does not exist"),
        ("actor.path=/nonexistent/model", "is not a model directory"),
        ("launcher.client_mem=0", "launcher.client_mem must be at least 1"),
        ("launcher.srun_additional_args='--x \"unclosed'", None),
        ("launcher.slurm.sbatch_additional_args=--job-name=mine", "rlkit sets --job-name itself (rlkit stop, resume"),
        ("launcher.slurm.sbatch_additional_args='--mail-type=END -o /tmp/x.out'", "rlkit sets -o itself"),
        ("launcher.slurm.sbatch_additional_args=--outp=/tmp/x.out", "rlkit sets --outp itself"),
        ("launcher.slurm.srun_additional_args=--chdir=/x", "rlkit sets --chdir itself (steps run from a directory"),
        ("gconfig.stop=[a,'']", "gconfig.stop[1] is '': a stop string must be a non-empty string"),
        ("eval_gconfig.stop=['']", "eval_gconfig.stop[0] is '': a stop string must be a non-empty string"),
    ],
)
def test_validation_errors(generate_yaml: Path, override: str, says: str | None) -> None:
    try:
        config = load_config(generate_yaml, [override])
    except ConfigError as exc:  # some mistakes are already caught by the schema
        assert says is None or says in exc.message
        return
    with pytest.raises(ConfigError) as info:
        raise_problems(config)
    if says:
        assert says in info.value.message


def test_a_bind_that_is_not_a_pair_of_paths_is_refused(generate_yaml: Path) -> None:
    config = load_config(generate_yaml, ["launcher.slurm.container_type=apptainer", "launcher.slurm.mount=/a:b"])
    with pytest.raises(ConfigError, match="is not /host/path:/container/path"):
        raise_problems(config)


def test_names_with_underscores_and_dashes_are_accepted_as_areal_writes_them(generate_yaml: Path) -> None:
    raise_problems(load_config(generate_yaml, ["experiment_name=gsm8k_grpo", "trial_name=run-1_b.2"]))


def test_missing_image_file(generate_yaml: Path, tmp_path: Path) -> None:
    image = tmp_path / "server.sif"
    image.write_bytes(b"sif")
    config = load_config(generate_yaml, ["launcher.slurm.container_type=apptainer",
                                         f"launcher.slurm.inference_server_image={image}",
                                         "launcher.slurm.trainer_image=/nope/trainer.sif"])
    with pytest.raises(ConfigError, match=r"trainer_image: image file '/nope/trainer\.sif' does not exist"):
        raise_problems(config)
    raise_problems(load_config(generate_yaml, ["launcher.slurm.container_type=apptainer",
                                         f"launcher.slurm.inference_server_image={image}",
                                         "launcher.slurm.trainer_image=docker://ghcr.io/x/trainer:1"]))


def test_env_and_mount_parsing() -> None:
    assert parse_env_vars("f", "A=1, B=x=y,,") == {"A": "1", "B": "x=y"}
    assert [b.text() for b in parse_mounts("/a:/b,/c:/d:ro")] == ["/a:/b", "/c:/d:ro"]


def test_every_schema_field_has_help() -> None:
    import dataclasses

    from rlkit.config.schema import experiment as schema

    for cls in (schema.ExperimentConfig, schema.ClusterConfig, schema.LauncherConfig, schema.SlurmConfig,
                schema.VllmConfig, schema.GenerateConfig):
        for f in dataclasses.fields(cls):
            assert f.metadata.get("help"), f"{cls.__name__}.{f.name} has no help"
    assert "launcher.slurm.inference_server_image" in schema_paths()


def test_relative_paths_are_made_absolute_at_submit(generate_yaml: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps run from / on other nodes: a relative dataset or ./model path means the submitting directory."""
    from rlkit.launch.submit import prepare

    (tmp_path / "local").mkdir()
    (tmp_path / "local" / "prompts.jsonl").write_text('{"prompt": "1+1="}\n')
    model = tmp_path / "local" / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    monkeypatch.chdir(tmp_path / "local")
    prepared = prepare(generate_yaml, ["generate.dataset.path=prompts.jsonl", "actor.path=./model",
                                       "vllm.model=org/hub-model"], dry_run=True)
    assert prepared.config.generate.dataset.path == str(tmp_path / "local" / "prompts.jsonl")
    assert prepared.config.actor.path == str(model)
    assert prepared.config.vllm.model == "org/hub-model", "a hub id is not a relative path (rlkit.launch.hub)"
    assert [w.message.split(":")[0] for w in prepared.warnings] == ["vllm.model"], "not in the hub cache yet"


def test_a_server_context_longer_than_the_model_is_refused(grpo_yaml: Path, fake_model: Path) -> None:
    """vLLM refuses to start with max_model_len above the model's positions: said at submit, not after the queue."""
    from rlkit.jobs.validate import validate

    (fake_model / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    errors = [str(e) for e in validate(load_config(grpo_yaml, ["vllm.max_model_len=2048"])).problems.errors]
    assert any("vllm.max_model_len (2048) exceeds the model's context of 512 tokens" in e for e in errors), errors
    assert not validate(load_config(grpo_yaml, ["vllm.max_model_len=512"])).problems.errors
