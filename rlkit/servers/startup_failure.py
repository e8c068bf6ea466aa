"""Why an inference server could not start, said in rlkit's keys, and whether a restart can fix it.

An engine that refuses to start prints its reason in its own words (`--max-model-len`, `gpu_memory_utilization`)
inside a traceback, and `rlkit serve` then fails like any crashed server: the supervisor restarts it up to
`recover.retries` times, each start paying the engine's load (minutes on a GPU) to fail the same way. This module
reads the server's lines as the step's log copy sees them (rlkit.servers.log_redact: token already blanked), knows the
deterministic refusals of vLLM 0.32 and SGLang 0.5 by their exact texts, and turns one into a diagnosis naming the
rlkit keys to change (`vllm.max_model_len`, `vllm.gpu_memory_utilization`, `vllm.extra_args.kv_cache_memory_bytes`,
`sglang.mem_fraction_static`, `sglang.context_length`, the servers' tp in `allocation_mode`) with the engine's
figures. A deterministic one ends the step with FatalStepError (NO_RETRY_EXIT: not restarted); one that another
process's memory may have caused is printed and the step fails as before (a restart may find the memory free).

The texts are matched only until the server is healthy (`StartupWatch.stop`), and only a few matched lines are kept.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rlkit.config.allocation import Allocation, ServerAllocation, canonical_mode, parse_allocation
from rlkit.config.schema.experiment import get_field
from rlkit.config.served_models import auxiliary_field, served_auxiliary_models
from rlkit.cuda_oom import oom_figures
from rlkit.errors import ConfigError, FatalStepError

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig

QUOTE_LIMIT = 240  # characters of the engine's line quoted in a diagnosis
_N = r"(\d{1,15})"  # an integer the engine printed (bounded: a hostile line cannot make a huge one)
_F = r"(\d{1,12}(?:\.\d{1,8})?)"  # a decimal figure (GiB, fractions)
HOPELESS_GRACE = 30.0  # seconds an engine that said it cannot start is given to exit before the step gives up on it


@dataclass(frozen=True)
class ServedWith:
    """What a server was started with, by the rlkit key that sets each value (what a diagnosis tells to change)."""

    backend: str  # "vllm" or "sglang"
    context_key: str  # vllm.max_model_len, sglang.context_length, auxiliary_models[i].max_model_len
    context: int | None  # its value; None: the model's own
    memory_key: str  # vllm.gpu_memory_utilization or sglang.mem_fraction_static
    memory: float
    kv_cache_bytes: str  # vllm.extra_args.kv_cache_memory_bytes as given; "" when unset (or SGLang)
    more_gpus: str  # how to give each server more GPUs (tensor parallelism): "allocation_mode vllm:d2 -> vllm:d1t2"


@dataclass(frozen=True)
class Diagnosis:
    """One recognised start-up failure: the text to show, and whether a restart of the step may fix it."""

    retryable: bool
    text: str


def served_with(config: ExperimentConfig, backend: str, tp: int, auxiliary: str = "") -> ServedWith:
    """The keys and values of server `backend` (an auxiliary model's when `auxiliary` names one) in `config`."""
    section = getattr(config, backend)
    memory_key = f"{backend}.gpu_memory_utilization" if backend == "vllm" else f"{backend}.mem_fraction_static"
    kv = ""
    if backend == "vllm":
        kv = next((str(v) for k, v in section.extra_args.items()
                   if str(k).replace("-", "_").lower() == "kv_cache_memory_bytes"), "")
    entry = next((e for e in served_auxiliary_models(config) if e.name == auxiliary), None) if auxiliary else None
    if entry is not None:
        context_key = auxiliary_field(config, entry.name, "max_model_len")
        context = entry.max_model_len
        more_gpus = f"{auxiliary_field(config, entry.name, 'tensor_parallel_size')} (now {tp}) -> {2 * tp}"
    else:
        context_key = "vllm.max_model_len" if backend == "vllm" else "sglang.context_length"
        context = get_field(config, context_key)
        more_gpus = _more_gpus(config.allocation_mode, tp)
    return ServedWith(backend, context_key, context, memory_key, float(get_field(config, memory_key)), kv,
                      more_gpus)


def _more_gpus(mode: str, tp: int) -> str:
    """allocation_mode with the servers' tp doubled (on as many GPUs when their dp allows), as a hint."""
    try:
        alloc = parse_allocation(mode)
    except ConfigError:
        alloc = Allocation(None, None)
    if alloc.server is None:
        return f"the servers' tp in allocation_mode (now {tp})"
    s = alloc.server
    wider = Allocation(ServerAllocation(s.backend, max(1, s.dp // 2), s.tp * 2), alloc.trainer)
    return f"allocation_mode {canonical_mode(alloc)} -> e.g. {canonical_mode(wider)} (tp {s.tp} -> {s.tp * 2})"


def quote(text: str) -> str:
    """The engine's words as one short line of plain text: cut, control and format characters (terminal escapes,
    bidirectional overrides, newlines) replaced by '?'. Rich markup is escaped where the line is printed."""
    cut = text.strip()
    cut = cut if len(cut) <= QUOTE_LIMIT else cut[:QUOTE_LIMIT] + "..."
    return '"' + "".join(c if c.isprintable() else "?" for c in cut) + '"'


def _cache_memory(s: ServedWith) -> str:
    """How to give the KV cache more memory, for the key that sets its size."""
    if s.kv_cache_bytes:
        return (f"raise vllm.extra_args.kv_cache_memory_bytes (now {s.kv_cache_bytes}; it sets the cache's size, "
                f"{s.memory_key} does not)")
    return f"raise {s.memory_key} (now {s.memory:g})"


def _context_now(s: ServedWith, engine_value: str) -> str:
    return f"{s.context_key}={s.context}" if s.context is not None else f"{s.context_key} unset (the model's own: " \
                                                                         f"{engine_value})"


# Each rule: (a literal the line must hold, its pattern, the diagnosis of a match). The literals keep the cost per
# line of server output to a few substring tests.
_Rule = tuple[str, "re.Pattern[str]", Callable[["re.Match[str]", ServedWith], tuple[bool, str, str]]]


def _vllm_kv_too_small(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    length, needed, available, estimate = m.group(1), m.group(2), m.group(3), m.group(4)
    figures = f": it needs {needed} GiB, {available} GiB is there" if needed != available else ""  # both 0.0: none
    what = f"its KV cache cannot hold one request of {length} tokens ({_context_now(s, length)}){figures}"
    lower = f"lower {s.context_key} to at most {estimate} (what the engine estimates fits)" if estimate else \
        f"lower {s.context_key}"
    return False, what, f"{lower}; or {_cache_memory(s)}; or more GPUs per server: {s.more_gpus}"


def _vllm_no_cache(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    if s.kv_cache_bytes:
        what = f"vllm.extra_args.kv_cache_memory_bytes={s.kv_cache_bytes} leaves no memory for the KV cache's blocks"
    else:
        what = f"the weights and activations leave no memory for the KV cache under {s.memory_key}={s.memory:g}"
    return False, what, f"{_cache_memory(s)}; or more GPUs per server: {s.more_gpus}"


def _vllm_too_long(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    most = re.sub(r"\.0+$", "", m.group(3))  # vLLM prints the derived length as a float after rope scaling
    what = (f"{s.context_key}={m.group(1)} is above the model's own maximum ({m.group(2)}={most}, "
            f"model_max_length={m.group(4)} in its config.json)")
    return False, what, (f"lower {s.context_key} to at most {most}, or leave it unset for the model's own "
                         "(vLLM goes past it only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 in vllm.env_vars, and warns "
                         "that the outputs may then be garbage)")


def _vllm_gpu_busy(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    what = (f"GPU {m.group(1)} had {m.group(2)} of {m.group(3)} GiB free at start, less than the {m.group(5)} GiB "
            f"that {s.memory_key}={m.group(4)} asks for: another process holds GPU memory (often a server of this "
            "job still exiting, or another job's process on a shared GPU), so a restart may find it free")
    return True, what, f"if it persists, free the GPU (nvidia-smi on the node) or lower {s.memory_key}"


def _vllm_cpu_busy(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    what = (f"memory node {m.group(1)} had {m.group(2)} of {m.group(3)} GiB available at start, less than the "
            f"{m.group(5)} GiB that {s.memory_key}={m.group(4)} asks for (on a CPU node it is the share of the "
            "node's memory): other processes hold memory, so a restart may find it free")
    return True, what, (f"if it persists, lower {s.memory_key}, or size the cache alone with "
                        "vllm.extra_args.kv_cache_memory_bytes")


def _vllm_cpu_kv(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    available, total, requested = float(m.group(2)), float(m.group(3)), float(m.group(4))
    never = requested > total  # more than the node has: no restart can find it
    key = "vllm.extra_args.kv_cache_memory_bytes" + (f" (now {s.kv_cache_bytes})" if s.kv_cache_bytes else "")
    what = (f"the KV cache asks for {requested:g} GiB, and memory node {m.group(1)} has {available:g} of "
            f"{total:g} GiB available" + ("" if never else ": other processes hold memory, so a restart may "
                                            "find it free"))
    return not never, what, f"lower {key if s.kv_cache_bytes else s.memory_key}, or free memory on the node"


def _sglang_no_memory(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    now = m.group(1) or f"{s.memory:g}"
    what = f"after the weights, no memory is left for the KV cache under {s.memory_key}={now}"
    return False, what, f"raise {s.memory_key} (now {now}); or more GPUs per server: {s.more_gpus}"


def _sglang_weights(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    what = f"the loaded weights leave no GPU memory for the KV cache under {s.memory_key}={m.group(1)}"
    return False, what, (f"raise {s.memory_key} above {m.group(2)} (the engine's minimum); or more GPUs per server: "
                         f"{s.more_gpus}")


def _sglang_too_long(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    what = f"{s.context_key}={m.group(1)} is above the model's own context length ({m.group(2)})"
    return False, what, (f"lower {s.context_key} to at most {m.group(2)}, or leave it unset for the model's own "
                         "(SGLang goes past it only with SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1 in "
                         "sglang.env_vars, at the risk of wrong outputs)")


def _cuda_oom(m: re.Match[str], s: ServedWith) -> tuple[bool, str, str]:
    """A CUDA out-of-memory before the server was healthy (loading weights, profiling, CUDA graphs). Not retried when
    torch's own figures show this process held the memory (other processes at most OTHERS_SHARE of the GPU): the
    same start on the same GPU fills it again. Retried when they show others holding memory, or there are no
    figures: a server of this job still exiting, or another job on a shared GPU, may be gone at the restart."""
    figures = oom_figures(m.string)
    others = figures.others()
    retryable, held = True, ""
    if others is not None and figures.total is not None and figures.own is not None:
        retryable = figures.others_held_memory()
        held = (f" (GPU {figures.gpu}: {figures.total.said}, this process held {figures.own.said}, others "
                f"{max(others, 0) / 2**30:.2f} GiB)")
    why = ("other processes held GPU memory, so a restart may find it free" if held else
           "who held the memory is unknown (torch printed no figures), so a restart may help") if retryable else \
        "the model does not fit this server's GPUs as configured"
    what = f"CUDA ran out of memory while starting{held}: {why}"
    return retryable, what, (f"more GPUs per server to spread the weights: {s.more_gpus}; or, if it ran out after "
                             f"loading the weights, lower {s.memory_key} (now {s.memory:g})")


_RULES: list[_Rule] = [
    ("To serve at least one request", re.compile(
        rf"To serve at least one request with the model's max seq len \({_N}\), \({_F} GiB KV cache is needed, "
        rf"which is larger than the available KV cache memory \({_F} GiB\)\. "
        rf"(?:Based on the available memory, the estimated maximum model length is {_N}\. )?"), _vllm_kv_too_small),
    ("No available memory for the cache blocks", re.compile(r"No available memory for the cache blocks\."),
     _vllm_no_cache),
    ("User-specified max_model_len", re.compile(
        rf"User-specified max_model_len \({_N}\) is greater than the derived max_model_len \((\w{{1,64}})="
        rf"([\w.]{{1,24}}) or model_max_length=([\w.]{{1,24}}) in model's config\.json\)\. To allow overriding"),
     _vllm_too_long),
    ("Free memory on device", re.compile(
        rf"Free memory on device (\S{{1,40}}) \({_F}/{_F} GiB\) on startup is less than (?:desired GPU memory "
        rf"utilization|the engine's budget after excluding external process's weights) \({_F}, {_F} GiB\)"),
     _vllm_gpu_busy),
    ("less than desired CPU memory utilization", re.compile(
        rf"Available memory on node (\S{{1,40}}) \({_F}/{_F} GiB\) on startup is less than desired CPU memory "
        rf"utilization \({_F}, {_F} GiB\)"), _vllm_cpu_busy),
    ("less than requested memory for kv", re.compile(
        rf"Available memory on node (\S{{1,40}}) \({_F}/{_F} GiB\) on kv cache allocation is less than requested "
        rf"memory for kv \({_F}(?:/{_F})? GiB\)"), _vllm_cpu_kv),
    ("Not enough memory. Please try to increase --mem-fraction-static", re.compile(
        rf"Not enough memory\. Please try to increase --mem-fraction-static\.(?: Current value: "
        rf"mem_fraction_static={_F})?"), _sglang_no_memory),
    ("Loaded weights leave no GPU memory for the KV cache", re.compile(
        rf"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={_F}\. Raise "
        rf"--mem-fraction-static above {_F}"), _sglang_weights),
    ("User-specified context_length", re.compile(
        rf"User-specified context_length \({_N}\) is greater than the derived context_length \({_N}\)\..*"
        r"To allow overriding this maximum"), _sglang_too_long),
    ("CUDA out of memory", re.compile(r"CUDA out of memory\. Tried to allocate"), _cuda_oom),
]


def diagnose(line: str, served: ServedWith) -> Diagnosis | None:
    """The diagnosis of one line of a server's output, None when it is none of the known start-up failures."""
    for literal, pattern, explain in _RULES:
        if literal not in line:
            continue
        match = pattern.search(line)
        if match is None:
            continue
        retryable, what, fix = explain(match, served)
        verdict = "a restart may fix it, so the step may be restarted" if retryable else \
            "a restart cannot fix this, so the step is not retried"
        text = (f"the {served.backend} server could not start: {what}; {verdict}\n  fix: {fix}\n"
                f"  {served.backend} said: {quote(line[match.start():])}")
        return Diagnosis(retryable, text)
    return None


class StartupWatch:
    """Watches a server's output lines (`see`, from the log copy's thread) until `stop`: keeps the first
    deterministic diagnosis and the first retryable one, nothing else."""

    def __init__(self, served: ServedWith) -> None:
        self._served = served
        self._lock = threading.Lock()
        self._stopped = False
        self.fatal: Diagnosis | None = None
        self._fatal_at: float | None = None  # when the fatal diagnosis was seen (time.monotonic)
        self.retryable: Diagnosis | None = None

    def see(self, line: str) -> None:
        if self._stopped or self.fatal is not None:
            return
        found = diagnose(line, self._served)
        if found is None:
            return
        with self._lock:
            if not found.retryable:
                self.fatal, self._fatal_at = found, time.monotonic()
            elif self.retryable is None:
                self.retryable = found

    def stop(self) -> None:
        """The server is healthy: its later lines are no start-up failure."""
        self._stopped = True

    def hopeless(self, grace: float = HOPELESS_GRACE) -> str | None:
        """A reason to stop waiting for health: a deterministic diagnosis seen `grace` seconds ago while the engine's
        process lives on (vLLM's API server may outlive its failed engine core); else None."""
        with self._lock:
            seen = self._fatal_at
        if seen is None or time.monotonic() - seen < grace:
            return None
        return f"the engine said it cannot start {grace:g} s ago"

    def judge(self, failure: BaseException) -> None:
        """After the server failed to start (`failure`) and its last lines were read: raise FatalStepError with a
        deterministic diagnosis; print a retryable one as an `rlkit serve:` line (the step then fails as before)."""
        with self._lock:
            fatal, retryable = self.fatal, self.retryable
        if fatal is not None:
            raise FatalStepError(fatal.text) from failure
        if retryable is not None:
            print(f"rlkit serve: {retryable.text}", flush=True)
