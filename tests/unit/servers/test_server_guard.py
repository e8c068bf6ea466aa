"""Pure and local tests of the server guard rules: extra_args refusals, SGLang's key file, the guard check against
a local HTTP server, and the batch script's supervisor leaving a NO_RETRY_EXIT step unretried (real bash)."""

from __future__ import annotations

import dataclasses
import json
import shlex
import stat
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from rlkit.config.schema.experiment import SGLangConfig, VllmConfig
from rlkit.errors import NO_RETRY_EXIT
from rlkit.launch.render import supervisor_body
from rlkit.servers.backend import backend_for
from rlkit.servers.extra_args import (
    SGLANG_FIELD_OPTIONS,
    SGLANG_REFUSED,
    VLLM_FIELD_OPTIONS,
    VLLM_REFUSED,
    extra_args_problems,
)
from rlkit.servers.guard_check import GuardCheckFailed, prove_guard
from rlkit.servers.health import find_free_port
from rlkit.servers.sglang.command import SGLANG_KEY_FIELD, sglang_command, write_key_file
from rlkit.servers.vllm.command import vllm_command
from rlkit.servers.vllm.flags import VLLM_FLAGS

# ---- extra_args ----------------------------------------------------------------------------------------------------


def fields(problems: list[tuple[str, str]]) -> list[str]:
    return [field for field, _ in problems]


def test_tuning_options_pass() -> None:
    assert extra_args_problems("vllm", {"max_num_batched_tokens": 2048, "enable_chunked_prefill": False,
                                        "cudagraph_capture_sizes": [1, 2, 4], "middleware": ["pkg.mod.Log"],
                                        "compilation_config": {"level": 0}, "max_logprobs": -1,
                                        "disable_fastapi_docs": True, "api_server_count": 1,
                                        "kv_cache_dtype": "auto"}) == []
    assert extra_args_problems("sglang", {"attention_backend": "fa3", "cuda_graph_bs": [1, 2],
                                          "enable_torch_compile": True, "max_running_requests": 8}) == []


def test_every_problem_is_listed_with_its_field() -> None:
    problems = extra_args_problems("vllm", {"grpc_port": 50051, "uds": "/tmp/s", "max_num_seqs": 8, "ok_typo": 1,
                                            "max_num_batched_tokens": 2048})
    assert fields(problems) == ["vllm.extra_args.grpc_port", "vllm.extra_args.uds", "vllm.extra_args.max_num_seqs",
                                "vllm.extra_args.ok_typo"]
    messages = dict(problems)
    assert "token guard does not cover" in messages["vllm.extra_args.grpc_port"]
    assert "remove it" in messages["vllm.extra_args.grpc_port"]
    assert "set vllm.max_num_seqs instead" in messages["vllm.extra_args.max_num_seqs"]
    assert "not an option of vLLM 0.32" in messages["vllm.extra_args.ok_typo"]


@pytest.mark.parametrize("key", ["grpc", "grpc_port", "grpc-port", "uds", "headless", "config", "api_key", "hf_token",
                                 "ssl_keyfile", "ssl-certfile", "enable_ssl_refresh", "host", "PORT", "model",
                                 "served_model_name", "tensor_parallel_size", "worker_extension_cls",
                                 "data_parallel_size", "data_parallel_rpc_port", "data_parallel_supervisor_port",
                                 "pipeline_parallel_size", "kv_events_config", "kv_transfer_config", "nnodes",
                                 "distributed_executor_backend", "root_path"])
def test_vllm_refuses_listeners_and_what_rlkit_sets(key: str) -> None:
    [(field, message)] = extra_args_problems("vllm", {key: "x"})
    assert field == f"vllm.extra_args.{key}"
    assert "refused" in message and "remove it" in message


@pytest.mark.parametrize("key", ["grpc_p", "ud", "api_k", "swap_space", "max_num_batched", "tp"])
def test_vllm_refuses_abbreviations_and_unknown_options(key: str) -> None:
    """vLLM's argparse takes `--grpc-p` for `--grpc-port`: only exact options of vLLM 0.32 pass."""
    [(_, message)] = extra_args_problems("vllm", {key: 1})
    assert "not an option of vLLM 0.32" in message


def test_unknown_option_suggests_an_allowed_spelling() -> None:
    [(_, message)] = extra_args_problems("vllm", {"max_num_batched_token": 1})
    assert "did you mean max_num_batched_tokens?" in message
    [(_, message)] = extra_args_problems("vllm", {"grpc_prt": 1})
    assert "grpc_port?" not in message  # never suggest a refused option


@pytest.mark.parametrize("key", ["api_key", "admin-api-key", "config", "grpc_mode", "smg_grpc_mode", "grpc_port",
                                 "use_ray", "encoder_only", "enable_dp_attention", "dp", "dp_size", "tp", "tp_size",
                                 "tensor_parallel_size", "pp", "nnodes", "dist_init_addr", "model", "model_path",
                                 "host", "port", "served_model_name", "ssl_keyfile", "disaggregation_bootstrap_port"])
def test_sglang_refuses_listeners_keys_and_what_rlkit_sets(key: str) -> None:
    [(_, message)] = extra_args_problems("sglang", {key: "x"})
    assert "refused" in message


@pytest.mark.parametrize("key", ["api_ke", "api", "admin_api", "conf", "grpc_m", "ssl_key", "use_r", "context_len"])
def test_sglang_refuses_prefixes_of_refused_options(key: str) -> None:
    """SGLang's argparse (allow_abbrev) would read `--api-ke KEY` as `--api-key KEY`."""
    [(_, message)] = extra_args_problems("sglang", {key: "x"})
    assert "prefix of --" in message and "refused" in message


@pytest.mark.parametrize(("backend", "options"), [("vllm", VLLM_FIELD_OPTIONS), ("sglang", SGLANG_FIELD_OPTIONS)])
def test_options_of_config_fields_point_to_the_field(backend: str, options: dict[str, str]) -> None:
    schema = VllmConfig if backend == "vllm" else SGLangConfig
    names = {f.name for f in dataclasses.fields(schema)}
    for option, field in options.items():
        assert field == f"{backend}.{option}" and option in names  # every entry names a real config field
        [(_, message)] = extra_args_problems(backend, {option.replace("_", "-"): 1})
        assert f"set {field} instead" in message


def test_refused_vllm_names_are_vllm_options() -> None:
    """A misspelt deny-list entry would refuse nothing: every refused vLLM name is one of vLLM 0.32's options."""
    assert set(VLLM_REFUSED) <= VLLM_FLAGS
    assert set(VLLM_FIELD_OPTIONS) <= VLLM_FLAGS


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("--uds=/tmp/x", "starts with '-'"),
        ([1, "--grpc-port=5"], "starts with '-'"),
        ("-x", "starts with '-'"),
        ([[1, 2]], "cannot be one command-line value"),
        ([None], "cannot be one command-line value"),
        (object(), "cannot go on a command line"),
    ],
)
def test_values_that_would_become_options_or_cannot_render(value: object, why: str) -> None:
    [(_, message)] = extra_args_problems("vllm", {"cudagraph_capture_sizes": value})
    assert why in message


def test_negative_numbers_as_text_pass() -> None:
    assert extra_args_problems("vllm", {"max_logprobs": "-1", "cudagraph_capture_sizes": ["-1.5e3"]}) == []
    assert extra_args_problems("sglang", {"some_float": "-0.5"}) == []


@pytest.mark.parametrize("key", ["--max-model-len", "max model len", "a=b", "port\n", "", "x;y"])
def test_bad_names(key: str) -> None:
    [(field, message)] = extra_args_problems("vllm", {key: 1})
    assert "not an option name" in message
    assert "\n" not in field


def test_same_option_twice_and_middleware_paths() -> None:
    problems = extra_args_problems("vllm", {"max_num_batched_tokens": 1, "max-num-batched-tokens": 2,
                                            "middleware": ["ok.Mod", "not a path"]})
    assert fields(problems) == ["vllm.extra_args.max-num-batched-tokens", "vllm.extra_args.middleware"]
    with pytest.raises(ValueError):
        extra_args_problems("tgi", {})


def test_commands_refuse_what_the_rules_refuse() -> None:
    """vllm_command and sglang_command refuse the same names even if a caller skipped the check."""
    base = {"python": "p", "model": "/m", "host": "h", "port": 1, "served_model_name": None, "tensor_parallel_size": 1}
    for key in ("grpc_port", "uds", "config"):
        with pytest.raises(ValueError):
            vllm_command(extra={key: "x"}, **base)  # type: ignore[arg-type]
    for key in ("config", "api_key", "grpc_mode"):
        with pytest.raises(ValueError):
            sglang_command(extra={key: "x"}, key_file="/k.yaml", **base)  # type: ignore[arg-type]
    assert set(SGLANG_REFUSED) >= {"config", "api_key", "admin_api_key"}


# ---- SGLang key file -----------------------------------------------------------------------------------------------


def test_sglang_key_file_is_private_and_spelled_api_dash_key(tmp_path: Path) -> None:
    token = "tok'en\"with: yaml # specials"
    path = tmp_path / "sglang-0.yaml"
    path.write_text("old")
    path.chmod(0o644)  # an existing file keeps its mode under O_CREAT: write_key_file must tighten it
    write_key_file(path, token)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert yaml.safe_load(path.read_text()) == {SGLANG_KEY_FIELD: token}  # as SGLang's merger reads it
    assert SGLANG_KEY_FIELD == "api-key"  # becomes --api-key (SGLang adds no dashes to config keys)
    with pytest.raises(ValueError):
        write_key_file(tmp_path / "k.json", token)  # SGLang reads .yaml/.yml only
    with pytest.raises(ValueError):
        write_key_file(tmp_path / "k.yaml", "")


# ---- the guard check against a local HTTP server -------------------------------------------------------------------


class Answers:
    """What the fake server answers on the probe path: without a token, and with the right one."""

    def __init__(self) -> None:
        self.bare = 401
        self.with_token = 200
        self.probe = backend_for("vllm").guard_probe  # the guarded route; every other path is 404
        self.seen: list[tuple[str, str | None]] = []


@pytest.fixture
def fake_server() -> Iterator[tuple[str, Answers]]:
    answers = Answers()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            auth = self.headers.get("Authorization")
            answers.seen.append((self.path, auth))
            if self.path != answers.probe:
                code = 404
            else:
                code = answers.with_token if auth == "Bearer right-token" else answers.bare
            body = json.dumps({"status": code}).encode()
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", answers
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize("backend", ["vllm", "sglang"])
def test_guard_check_passes_a_guarded_server(fake_server: tuple[str, Answers], backend: str) -> None:
    url, answers = fake_server
    answers.probe = backend_for(backend).guard_probe
    prove_guard(url, backend_for(backend), "right-token")
    assert answers.seen == [(answers.probe, None), (answers.probe, "Bearer right-token")]


@pytest.mark.parametrize("bare", [200, 404, 403, 500])
def test_guard_check_refuses_an_open_server(fake_server: tuple[str, Answers], bare: int) -> None:
    url, answers = fake_server
    answers.bare = bare
    with pytest.raises(GuardCheckFailed, match=f"without the token with HTTP {bare}, not 401") as info:
        prove_guard(url, backend_for("vllm"), "right-token")
    assert info.value.exit_code == NO_RETRY_EXIT
    assert "right-token" not in str(info.value)
    assert len(answers.seen) == 1  # the token is never sent to a server that answered without it


def test_guard_check_refuses_a_server_that_refuses_the_token(fake_server: tuple[str, Answers]) -> None:
    url, answers = fake_server
    answers.with_token = 401
    answers.probe = backend_for("sglang").guard_probe
    with pytest.raises(GuardCheckFailed, match="with the trial token with HTTP 401, not 200"):
        prove_guard(url, backend_for("sglang"), "right-token")


def test_guard_check_refuses_when_nothing_answers() -> None:
    with pytest.raises(GuardCheckFailed, match="could not ask"):
        prove_guard(f"http://127.0.0.1:{find_free_port()}", backend_for("vllm"), "t", timeout=2.0)


# ---- the supervisor does not retry NO_RETRY_EXIT (the real bash text of the batch script) --------------------------


def run_supervisor(tmp_path: Path, server_exit: int, server_says: str = "") -> tuple[int, int, str]:
    """Run the job script's supervisor (the real template) with a server step that exits `server_exit` and a trainer
    that waits. `scancel` is a stub here that only records its arguments, and the node check one that
    passes: nothing reaches Slurm."""
    body = supervisor_body(trial_dir=str(tmp_path), attempt=1, retries=2, trainer_group=1, steps=[
        "STOP_GRACE=1",
        f"cmd_server() {{ echo run >> runs.txt; {server_says} exit {server_exit}; }}",
        "cmd_trainer() { while [ ! -e done ]; do sleep 0.1; done; }",
        "component_policy 0 server 0 on-exit 0", "component_policy 1 trainer 1 on-failure 1",
        "start_step server-0 0 cmd_server", "start_step trainer 1 cmd_trainer",
    ], node_checks=["node_check_0() { return 0; }", "NODE_CHECKS=(node_check_0)"])
    from tests.helpers.slurm_stubs import path_with, slurm_bin

    stubs = slurm_bin(tmp_path, scancel='echo "$*" >> scancel.txt')
    done = subprocess.run(["bash", "-c", body], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                          env={"PATH": path_with(stubs), "SLURM_JOB_ID": "4242"})
    runs = len((tmp_path / "runs.txt").read_text().splitlines())
    assert "--signal=TERM 4242" in (tmp_path / "scancel.txt").read_text(), "stop_steps stops the job's steps"
    return done.returncode, runs, done.stdout


def test_supervisor_does_not_retry_a_no_retry_exit(tmp_path: Path) -> None:
    rc, runs, out = run_supervisor(tmp_path, NO_RETRY_EXIT)
    assert (rc, runs) == (NO_RETRY_EXIT, 1), out
    assert "which a restart cannot fix" in out
    assert f"rlkit: step server-0 failed with exit code {NO_RETRY_EXIT}" in out  # the line rlkit status reads


def test_a_full_disk_is_named_in_the_job_output_and_the_end_record_says_failed(tmp_path: Path) -> None:
    """The step's own log names the full disk (rlkit.cli.main); the batch script repeats it in the job's output,
    does not retry, and its end record (what rlkit status shows once Slurm forgets the job) says FAILED."""
    (tmp_path / "logs").mkdir()
    says = "echo 'failed: the disk is full (No space left on device) writing /f/t/weights/x' > logs/server-0.log;"
    rc, runs, out = run_supervisor(tmp_path, NO_RETRY_EXIT, says)
    assert (rc, runs) == (NO_RETRY_EXIT, 1), out
    assert "rlkit: step server-0: the disk is full (No space left on device) writing /f/t/weights/x" in out, out
    assert (tmp_path / "job_end").read_text().splitlines()[:3] == ["4242", "FAILED", str(NO_RETRY_EXIT)]


def test_the_job_output_names_the_failure_its_process_printed_before_the_no_retry_mark(tmp_path: Path) -> None:
    """A server that cannot start (rlkit.servers.startup_failure) or a trainer out of memory says why in its step's
    log, then the no-retry mark of its run: the batch script repeats that `failed:` line, not an engine's line with
    the same word before it nor another process's after the mark."""
    from rlkit.step_contract import NO_RETRY_MARK

    (tmp_path / "logs").mkdir()
    lines = ["(APIServer) ERROR Health check failed: engine core died",
             "failed: the vllm server could not start: the KV cache holds fewer tokens than vllm.max_model_len=256",
             "  fix: lower vllm.max_model_len to at most 128", f"{NO_RETRY_MARK} 4242.0.0",
             "failed: a peer's line after the mark"]
    says = "".join(f"echo {shlex.quote(line)} >> logs/server-0.log; " for line in lines)
    rc, runs, out = run_supervisor(tmp_path, NO_RETRY_EXIT, says)
    assert (rc, runs) == (NO_RETRY_EXIT, 1), out
    assert ("rlkit: step server-0: the vllm server could not start: the KV cache holds fewer tokens than "
            "vllm.max_model_len=256\n") in out, out
    assert "peer's line" not in out and "engine core died" not in out


def test_supervisor_still_retries_other_failures(tmp_path: Path) -> None:
    rc, runs, out = run_supervisor(tmp_path, 1)
    assert runs == 3, out  # the first start and RETRIES=2 restarts
    assert rc == 1
