"""`auxiliary_models`: the config list, its checks, the plan and script of a three-component job, the supervisor's
policy table, the name-resolve keys that keep the groups apart, and the client reward functions use (against a
stand-in HTTP server here; real vLLM servers in tests/integration/test_auxiliary_e2e.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from rlkit.config.load import load_config, to_yaml
from rlkit.errors import ConfigError
from rlkit.jobs.validate import validate
from rlkit.launch.plan import AUXILIARY_ROLE, SERVER_ROLE, TRAINER_ROLE
from rlkit.launch.render import render_script, supervisor_body
from tests.helpers.planning import plan_of


def judge(model: Path | str, **fields: object) -> str:
    """An override setting auxiliary_models to one judge entry (more fields as given)."""
    more = "".join(f", {k}: {v}" for k, v in fields.items())
    return f"auxiliary_models=[{{name: judge, model_path: {model}{more}}}]"


def messages(config_path: Path, overrides: list[str]) -> list[str]:
    return [str(e) for e in validate(load_config(config_path, overrides)).problems.errors]


# ---- config ---------------------------------------------------------------------------------------------------------


def test_entries_load_with_defaults_and_index_paths(grpo_yaml: Path, fake_model: Path) -> None:
    from rlkit.config.schema.experiment import get_field, set_field

    config = load_config(grpo_yaml, [judge(fake_model, engine_num=2)])
    (entry,) = config.auxiliary_models
    assert (entry.name, entry.engine_num, entry.tensor_parallel_size, entry.backend, entry.max_model_len) == \
        ("judge", 2, 1, "vllm", None)
    assert get_field(config, "auxiliary_models[0].model_path") == str(fake_model)
    set_field(config, "auxiliary_models[0].model_path", "/elsewhere")
    assert config.auxiliary_models[0].model_path == "/elsewhere"
    assert "auxiliary_models:\n- name: judge\n" in to_yaml(config)  # what the job's steps read back


@pytest.mark.parametrize(("value", "says"), [
    ("{name: judge}", "auxiliary_models (in a command-line override) must be a list of models, not a dict"),
    ("[{name: judge, modle_path: /m}]", "unknown key 'auxiliary_models[0].modle_path'"),
    ("[{name: judge, engine_num: two}]", "wrong type for 'auxiliary_models[0].engine_num'"),
    ("[judge]", "auxiliary_models[0] (in a command-line override) must be a mapping"),
])
def test_malformed_lists_are_named_beside_other_mistakes(grpo_yaml: Path, value: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(grpo_yaml, [f"auxiliary_models={value}", "seed=x"])
    text = str(info.value)
    assert says in text and "wrong type for 'seed'" in text, text
    if "modle_path" in value:
        assert "did you mean 'model_path'?" in text


def _positions_model(tmp_path: Path) -> Path:
    model = tmp_path / "short-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"max_position_embeddings": 64}))
    return model


@pytest.mark.parametrize(("overrides", "says"), [
    (["auxiliary_models=[{name: judge, model_path: MODEL}, {name: judge, model_path: MODEL}]"],
     "auxiliary_models[1].name 'judge' is also the name of auxiliary_models[0]"),
    (["auxiliary_models=[{name: my-judge, model_path: MODEL}]"], "auxiliary_models[0].name 'my-judge' is not an "
                                                                 "identifier"),
    ([judge("MODEL", engine_num=0)], "auxiliary_models[0].engine_num must be at least 1"),
    ([judge("MODEL", tensor_parallel_size=2)], "tensor_parallel_size 2 does not fit one server on a node of "
                                               "cluster.n_gpus_per_node=1"),
    ([judge("MODEL", backend="tgi")], "auxiliary_models[0].backend 'tgi' is not an inference engine rlkit runs"),
    ([judge("/no/such/model")], "auxiliary_models[0].model_path: '/no/such/model' is not a model directory"),
    (["auxiliary_models=[{name: judge}]"], "auxiliary_models[0].model_path is empty"),
    ([judge("SHORT", max_model_len=128)], "auxiliary_models[0].max_model_len (128) exceeds the model's context of 64"),
    ([judge("MODEL"), "type=sft", "allocation_mode=fsdp:d2"],
     "job type sft trains on its dataset alone: no rollouts, so no reward function that could call them"),
    ([judge("MODEL", backend="sglang"), "launcher.slurm.container_type=apptainer"],
     "auxiliary_models[0].backend is sglang, but every server runs in launcher.slurm.inference_server_image"),
])
def test_each_refusal_is_reported_with_its_fix_beside_another_problem(
        grpo_yaml: Path, fake_model: Path, tmp_path: Path, overrides: list[str], says: str) -> None:
    short = _positions_model(tmp_path)
    overrides = [o.replace("MODEL", str(fake_model)).replace("SHORT", str(short)) for o in overrides]
    found = messages(grpo_yaml, [*overrides, "cluster.n_nodes=4", "rollout.max_concurrent_rollouts=0"])
    assert any(says in m and "fix:" in m for m in found), found
    assert any("rollout.max_concurrent_rollouts must be at least 1" in m for m in found), found


def test_a_valid_judge_passes_and_the_models_are_bound_and_anchored(grpo_yaml: Path, fake_model: Path,
                                                                     tmp_path: Path) -> None:
    from rlkit.checks.binds import container_binds
    from rlkit.checks.site_files import make_paths_absolute
    from rlkit.launch.hub import has_hub_ids

    assert messages(grpo_yaml, [judge(fake_model), "cluster.n_nodes=4"]) == []
    judge_dir = tmp_path / "judges" / "j1"
    judge_dir.mkdir(parents=True)
    config = load_config(grpo_yaml, [judge("./judges/j1")])
    make_paths_absolute(config, str(tmp_path))
    assert config.auxiliary_models[0].model_path == str(judge_dir)
    config.launcher.slurm.mount = "/unrelated:/unrelated"
    assert f"{judge_dir}:{judge_dir}" in [b.text() for b in container_binds(config)[1]]
    assert has_hub_ids(load_config(grpo_yaml, [judge("Qwen/Qwen2.5-7B-Instruct")]))


# ---- plan and script --------------------------------------------------------------------------------------------


def test_plan_puts_auxiliary_groups_between_servers_and_trainer(grpo_yaml: Path, fake_model: Path) -> None:
    config = load_config(grpo_yaml, [judge(fake_model, engine_num=2), "cluster.n_nodes=5",
                                     "launcher.slurm.nodelist=n[1-5]"])
    plan = plan_of(config)
    assert [(c.role, c.name, c.nodes, c.nodelist) for c in plan.components] == [
        (SERVER_ROLE, "", 1, "n1"), (AUXILIARY_ROLE, "judge", 2, "n2,n3"), (TRAINER_ROLE, "", 2, "n4,n5")]
    assert plan.trainer_group == 2  # Slurm's time-limit warning still goes to the trainer
    aux = [s for s in plan.steps if s.role == AUXILIARY_ROLE]
    assert [(s.name, s.het_group, s.relative_node, s.gpus_per_node) for s in aux] == [
        ("aux-judge-0", 1, 0, 1), ("aux-judge-1", 1, 1, 1)]
    assert aux[1].argv[-6:] == ("--trial-dir", plan.trial_dir, "--index", "1", "--auxiliary", "judge")
    assert aux[0].image == config.launcher.slurm.inference_server_image and aux[0].log.endswith("/aux-judge-0.log")
    assert plan.steps[-1].het_group == 2 and plan.steps[-1].name == "grpo"
    assert any("auxiliary model judge" in note for note in plan.notes)


def test_the_auxiliary_nodes_count_against_the_cluster(grpo_yaml: Path, fake_model: Path) -> None:
    with pytest.raises(ConfigError) as info:
        plan_of(load_config(grpo_yaml, [judge(fake_model)]))  # 1 + 1 + 2 nodes of 1 GPU on a cluster of 3
    assert ("needs 4 nodes of 1 GPU (1 server + 1 auxiliary judge + 2 trainer GPUs, placed 1, 1, 1, 1 per node) but "
            "cluster.n_nodes is 3") in info.value.message
    assert info.value.hint == "set cluster.n_nodes=4 or use fewer GPUs"
    # 3 judge GPUs do not fill nodes of 2: the steps share nodes, and the judge's GPUs still count (2 + 1 + 3 = 6)
    three = [judge(fake_model, engine_num=3), "cluster.n_gpus_per_node=2"]
    plan = plan_of(load_config(grpo_yaml, [*three, "cluster.n_nodes=3"]))
    assert plan.packed and plan.requests[0].nodes == 3
    with pytest.raises(ConfigError) as info:
        plan_of(load_config(grpo_yaml, [*three, "cluster.n_nodes=2"]))
    assert "needs 3 nodes of 2 GPUs" in info.value.message and info.value.hint.startswith("set cluster.n_nodes=3")


def test_three_component_script_is_driven_by_the_policy_table(grpo_yaml: Path, fake_model: Path) -> None:
    script = render_script(plan_of(load_config(grpo_yaml, [judge(fake_model), "cluster.n_nodes=4"])))
    assert script.count("#SBATCH hetjob") == 2
    table = [line for line in script.splitlines() if line.startswith("component_policy ")]
    assert table == ["component_policy 0 server 0 on-exit 0", "component_policy 1 auxiliary 0 on-exit 0",
                     "component_policy 2 trainer 1 on-failure 1"]
    assert "start_step aux-judge-0 1 cmd_aux_judge_0" in script
    assert "NODE_CHECKS=(node_check_0 node_check_1 node_check_2)  #" in script  # step 0 on each component
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    run = subprocess.run(["shellcheck", "--shell=bash", "-"], input=script, capture_output=True, text=True,
                         check=False)
    assert run.returncode == 0, run.stdout


def test_supervisor_restarts_an_auxiliary_server_and_stops_it_when_the_work_is_done(tmp_path: Path) -> None:
    """The real template with three components: the judge's step exits once and is restarted (its policy row
    says on-exit), the trainer's success ends the job, and the servers are stopped then (scancel recorded)."""
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=2, trainer_group=2, steps=[
        "STOP_GRACE=1",
        "component_policy 0 server 0 on-exit 0", "component_policy 1 auxiliary 0 on-exit 0",
        "component_policy 2 trainer 1 on-failure 1",
        "cmd_server() { while :; do sleep 0.1; done; }",  # servers run until the supervisor stops them
        "cmd_judge() { echo run >> judge-runs.txt; [ -e judge-ran ] || { touch judge-ran; exit 3; }; "
        "while :; do sleep 0.1; done; }",
        "cmd_trainer() { while [ ! -e judge-ran ] || [ $(wc -l < judge-runs.txt) -lt 2 ]; do sleep 0.1; done; }",
        "start_step server-0 0 cmd_server", "start_step aux-judge-0 1 cmd_judge", "start_step grpo 2 cmd_trainer",
    ], node_checks=["node_check_0() { return 0; }", "NODE_CHECKS=(node_check_0)"])  # step 0 passes
    from tests.helpers.slurm_stubs import path_with, slurm_bin

    stubs = slurm_bin(tmp_path, scancel='echo "$*" >> scancel.txt')
    done = subprocess.run(["bash", "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": path_with(stubs), "SLURM_JOB_ID": "4243"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rlkit: auxiliary step aux-judge-0 exited (code 3) while the job was running; restarting it" in done.stdout
    assert "rlkit: all work steps finished; stopping the servers" in done.stdout
    assert len((tmp_path / "judge-runs.txt").read_text().splitlines()) == 2


# ---- name resolve and the client ----------------------------------------------------------------------------------


def _record(index: int, address: str, model: str) -> str:
    return json.dumps({"index": index, "address": address, "backend": "vllm", "model": model, "node": "n1"})


def test_policy_and_auxiliary_records_never_mix(tmp_path: Path) -> None:
    from rlkit.nameresolve import NfsNameResolve, read_servers, server_key
    from rlkit.servers.pool import discover_servers

    with NfsNameResolve(tmp_path / "nr") as nr:
        nr.add(server_key(0), _record(0, "p0:1", "/policy"))
        nr.add(server_key(0, "judge"), _record(0, "j0:1", "/judge"))
        nr.add(server_key(1, "judge"), _record(1, "j1:1", "/judge"))
        nr.add(server_key(0, "critic"), _record(0, "c0:1", "/critic"))
        assert server_key(1, "judge") == "auxiliary/judge/1"
        assert [r.address for r in read_servers(nr)] == ["p0:1"]  # what rollouts and weight updates see
        assert [s.address for s in discover_servers(nr, "judge")] == ["j0:1", "j1:1"]
        assert [r.address for r in read_servers(nr, "critic")] == ["c0:1"]


class _StandIn(BaseHTTPRequestHandler):
    """vLLM's /v1/completions answer shape behind a bearer token; records what it was asked."""

    token = "trial-token"
    seen: ClassVar[list[dict[str, object]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.headers.get("Authorization") != f"Bearer {self.token}":
            self.send_response(401)
            self.end_headers()
            return
        type(self).seen.append(body)
        answer = {"choices": [{"index": i, "text": f"yes{i}", "token_ids": [9], "finish_reason": "length",
                               "logprobs": {"token_logprobs": [-0.5]}} for i in range(body["n"])]}
        data = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def judge_trial(grpo_yaml: Path, fake_model: Path, tmp_path: Path) -> Iterator[Path]:
    """A trial directory (config, 0600 token) whose name resolve holds one live judge record: a stand-in server."""
    from rlkit.nameresolve import name_resolve_for, server_key
    from rlkit.trials.paths import TrialPaths

    config = load_config(grpo_yaml, [judge(fake_model), f"cluster.fileroot={tmp_path}/root"])
    paths = TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name)
    paths.token.parent.mkdir(parents=True, mode=0o700)
    paths.config.write_text(to_yaml(config))
    fd = os.open(paths.token, os.O_WRONLY | os.O_CREAT, 0o600)
    os.write(fd, f"{_StandIn.token}\n".encode())
    os.close(fd)
    _StandIn.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _StandIn)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    nr = name_resolve_for(config)
    nr.add(server_key(0, "judge"), _record(0, f"127.0.0.1:{server.server_address[1]}", str(fake_model)),
           keepalive=True)
    try:
        yield paths.root
    finally:
        nr.close()
        server.shutdown()
        thread.join()


def test_client_sends_token_ids_with_the_trial_token(judge_trial: Path, fake_model: Path) -> None:
    from rlkit.rewards.auxiliary import AuxiliaryModel

    model = AuxiliaryModel("judge", judge_trial)
    try:
        assert model.generate([5, 6], n=2, max_new_tokens=3, temperature=0.0) == ["yes0", "yes1"]
        (completion,) = model.complete([7], max_new_tokens=1)
        assert completion.token_ids == [9] and completion.logprobs == [-0.5]
    finally:
        model.close()
    first = _StandIn.seen[0]
    assert (first["prompt"], first["n"], first["max_tokens"], first["model"]) == ([5, 6], 2, 3, str(fake_model))


def test_client_refuses_unknown_names_keywords_and_a_missing_trial(judge_trial: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.rewards.auxiliary import TRIAL_DIR_ENV, AuxiliaryModel, AuxiliaryModelError

    with pytest.raises(AuxiliaryModelError, match="no auxiliary model 'critic' \\(auxiliary_models: judge\\)"):
        AuxiliaryModel("critic", judge_trial).generate([1])
    with pytest.raises(TypeError, match="unknown sampling keyword\\(s\\) max_tokens; known: n, max_new_tokens"):
        AuxiliaryModel("judge", judge_trial).generate([1], max_tokens=3)
    monkeypatch.delenv(TRIAL_DIR_ENV, raising=False)
    with pytest.raises(AuxiliaryModelError, match=f"\\${TRIAL_DIR_ENV} is not set"):
        AuxiliaryModel("judge").generate([1])


REWARD_MODULE = """
from rlkit.rewards.auxiliary import auxiliary_model

JUDGE = auxiliary_model("judge")


def ask_judge(prompt, completion, row):
    (answer,) = JUDGE.generate([len(completion)], max_new_tokens=1)
    return 1.0 if answer == "yes0" else 0.0
"""


def test_a_reward_worker_reaches_the_judge_from_its_environment(judge_trial: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner hands its workers the trial directory (as the trainer does); the user's module, imported in the
    worker, finds the judge, its token and its server from there alone."""
    import asyncio

    from rlkit.rewards.auxiliary import trial_environment
    from rlkit.rewards.resolve import resolve_reward_fn
    from rlkit.rewards.runner import RewardRunner

    (tmp_path / "rlkit_test_judge_reward.py").write_text(REWARD_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path), *sys.path]))
    runner = RewardRunner(resolve_reward_fn("rlkit_test_judge_reward:ask_judge", "answer"), 60, workers=1,
                          env=trial_environment(judge_trial))
    try:
        outcome = asyncio.run(runner.score("p", "abc", {}))
    finally:
        runner.close()
        sys.modules.pop("rlkit_test_judge_reward", None)
    assert (outcome.value, outcome.error) == (1.0, None)
    assert _StandIn.seen and _StandIn.seen[-1]["prompt"] == [3]


def test_a_zero_sized_auxiliary_server_is_a_config_error_in_the_plan_too(grpo_yaml: Path, fake_model: Path) -> None:
    """Validation names it; the plan, which submit still builds to report layout problems beside it, must not divide
    by it (it raised ZeroDivisionError, a traceback at submit)."""
    with pytest.raises(ConfigError, match="needs at least one GPU"):
        plan_of(load_config(grpo_yaml, [judge(fake_model, tensor_parallel_size=0), "cluster.n_nodes=4"]))
