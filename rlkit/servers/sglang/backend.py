"""rlkit's SGLang backend: the `ServerBackend` for `python -m sglang.launch_server`, against SGLang 0.5.23's HTTP API.

Every route and field below was read in SGLang 0.5.23's source (`sglang/srt/entrypoints/http_server.py` for the
routes, `sglang/srt/managers/io_struct.py` for the request bodies) and run against a real SGLang 0.5.23 server on the
CPU (tests/integration/test_sglang_backend.py, with a test-only one-function kernel shim). What differs from vLLM:

- Pause keeps requests by RETRACTING them (`/pause_generation {"mode": "retract"}`): their KV is freed and they go
  back to the waiting queue, so they recompute it with the new weights on resume. The route's default mode is
  "abort" (drops every request), and "in_place" keeps old KV, with which `/flush_cache` refuses to run.
- The cache flush answers 400 when it did not flush (`/flush_cache`: "When there are running or waiting requests,
  the operation will not be performed"); after a retract pause the scheduler ignores the waiting queue
  (`Scheduler.flush_cache`: `is_fully_idle(ignore_waiting=self._engine_paused)`), so pause -> load -> flush works.
- The version is `GET /model_info`'s `weight_version` ("default" until set); a weight load sets it from its own
  `weight_version` field; `/update_weight_version` sets it alone (and aborts every request unless told not to).
- A broadcast is a session: `/update_weights_from_distributed` refuses to run outside `/begin_weight_update` ..
  `/end_weight_update` (`SchedulerWeightUpdaterManager.update_weights_from_distributed`).
- Completion log-probs are `log_softmax(logits / temperature)` before top-k/top-p (`Sampler.forward`, unless the
  server's environment sets SGLANG_RETURN_ORIGINAL_LOGPROB, which `launch` removes): the same numbers as the
  trainer's `token_logprobs` at the same temperature.
- LoRA adapters (`actor.use_lora`) load at run time by name, and `/generate` names one in `lora_path`
  (rlkit.servers.sglang.lora).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.errors import FatalStepError, StepError
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
from rlkit.servers.extra_args import SGLANG_FIELD_OPTIONS, extra_args_problems, owned_option_problems
from rlkit.servers.http import answer_json, call
from rlkit.servers.sglang import lora
from rlkit.servers.sglang.command import sglang_command, write_key_file

if TYPE_CHECKING:
    import httpx

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.weight_delta import DeltaHeader

# Variables of the inherited environment that would change what the routes below mean.
_UNSET_ENV = (
    "SGLANG_RETURN_ORIGINAL_LOGPROB",  # completion log-probs without the temperature (layers/sampler.py)
    "SGLANG_ENABLE_REQUEST_HEADER_OVERRIDES",  # lets request headers change sampling (http_server.py)
)
# Set for every SGLang server: GET /health answers from the HTTP process (503 while starting, 200 once up) instead of
# generating a token, which waits while the server is paused for a weight update and would make the rollout
# controller take a server loading weights for a silent one (rlkit.rollout.silence).
_LAUNCH_ENV = {"SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION": "0"}


class SglangBackend(ServerBackend):
    """SGLang 0.5.23 as rlkit drives it (see the module docstring for what differs from vLLM)."""

    name = "sglang"
    model_field = "sglang.model_path"
    context_field = "sglang.context_length"
    guard_probe = "/v1/models"  # "normal" auth level: SGLang's api-key middleware answers 401 without the key
    guard_hint = "did SGLang read --api-key from rlkit's --config file?"
    adapter_cache_by_name = False  # each adapter load gets a fresh lora_id, the radix cache's key (sglang.lora)
    launch_env_names = (*_UNSET_ENV, *_LAUNCH_ENV)

    # ---- config side ----

    def configured_model(self, config: ExperimentConfig) -> str | None:
        return config.sglang.model_path or None

    def context_length(self, config: ExperimentConfig) -> int | None:
        return config.sglang.context_length

    def extra_args_problems(self, extra: Mapping[str, object]) -> list[tuple[str, str]]:
        return extra_args_problems("sglang", extra)

    def lora_problems(self, config: ExperimentConfig) -> list[tuple[str, str]]:
        found = []
        modules = [m for m in config.actor.target_modules or [] if isinstance(m, str)]
        unknown = [m for m in modules if m not in lora.LORA_MODULES]
        if unknown:
            found.append((f"actor.target_modules: {unknown!r} are not modules SGLang 0.5.23 serves adapters on (its "
                          "--lora-target-modules choices)",
                          f"use some of: {', '.join(lora.LORA_MODULES)}; or serve with vLLM"))
        return found + owned_option_problems(self.name, config.sglang.extra_args, lora.LORA_OPTIONS,
                                             "rlkit derives it from actor.lora_rank and actor.target_modules")

    def serving_dtype(self, config: ExperimentConfig) -> str:
        return config.sglang.dtype

    def sampled_logprob_meaning(self, config: ExperimentConfig) -> LogprobMeaning:
        """Log-probs of the temperature-scaled distribution (`layers/sampler.py`): `launch` removes
        SGLANG_RETURN_ORIGINAL_LOGPROB, the one switch that would make them raw."""
        return "temperature"

    def launch(self, config: ExperimentConfig, *, python: str, model: str, host: str, port: int, tp: int,
               token: str, secret_dir: Path, index: int) -> ServerLaunch:
        """`python -m sglang.launch_server ... --config <secret_dir>/sglang-<index>.yaml`: the token is the api key
        inside that 0600 YAML file (SGLang reads `--api-key` from argv or a config file only; see
        rlkit.servers.sglang.command), never on argv or in the environment. BUT SGLang 0.5.23 logs its resolved
        arguments at start-up, api key included, in clear (`engine.py`: `logger.info(f"server_args=...")`; seen in
        the tests' server log): whatever captures the server's output holds the token and must be as private as
        the token file."""
        problems = self.extra_args_problems(config.sglang.extra_args)
        if problems:
            listed = "\n".join(f"  {field}: {message}" for field, message in problems)
            raise FatalStepError(f"refused sglang extra_args (nothing was started):\n{listed}")
        extra: dict[str, object] = {name: getattr(config.sglang, name) for name in SGLANG_FIELD_OPTIONS}
        extra.update(config.sglang.extra_args)
        key_file = write_key_file(Path(secret_dir) / f"sglang-{index}.yaml", token)
        argv = sglang_command(python=python, model=model, host=host, port=port, served_model_name=None,
                              tensor_parallel_size=tp, key_file=str(key_file), extra=extra)
        if config.actor.use_lora:  # adapters loaded at run time (rlkit.servers.sglang.lora)
            argv += lora.lora_flags(config.actor.lora_rank, config.actor.target_modules, config.sglang.extra_args)
        return ServerLaunch(argv=argv, env=dict(_LAUNCH_ENV), unset_env=_UNSET_ENV)

    # ---- requests ----

    async def complete(self, client: httpx.AsyncClient, server: Server, prompt_ids: list[int],
                       params: SamplingParams) -> list[Completion]:
        """`POST /generate` with `input_ids`, `sampling_params` and `return_logprob` (io_struct.GenerateReqInput).

        Without a seed: one prompt with `sampling_params.n` (GenerateReqInput._handle_parallel_sampling: SGLang
        prefills the prompt once, then samples n times; the answer is a list of n results). With a seed: a batch of
        n copies of the prompt, copy i with `sampling_seed = seed + i`, since SGLang's seeded sampling
        (`multinomial_with_seed`) depends on the seed and the position only, so n copies under one seed would be n
        identical samples. SGLang honours `sampling_seed` only on a server started with
        `--enable-deterministic-inference` (SamplingBatchInfo.from_schedule_batch); otherwise it is ignored.

        Each result: `output_ids`, `meta_info.output_token_logprobs` (`[[logprob, token_id, text|null], ...]`,
        log_softmax(logits / temperature)) and `meta_info.finish_reason` (`{"type": "stop"|"length"|"abort", ...}`).
        An aborted result is refused (ValueError): the pool retries the prompt.
        """
        n = params.n
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        sampling: dict[str, Any] = {
            "max_new_tokens": params.max_new_tokens, "temperature": params.temperature, "top_p": params.top_p,
            "top_k": params.top_k, "skip_special_tokens": False,
        }
        if params.min_new_tokens > 0:
            sampling["min_new_tokens"] = params.min_new_tokens
        if params.stop:
            sampling["stop"] = list(params.stop)
        body: dict[str, Any] = {"return_logprob": True, **_adapter_field(server)}
        if params.seed is None:
            body.update(input_ids=list(prompt_ids), sampling_params={**sampling, "n": n})
        else:
            body.update(input_ids=[list(prompt_ids)] * n,
                        sampling_params=[{**sampling, "sampling_seed": (params.seed + i) % 2**63} for i in range(n)])
        response = await client.post(f"{server.url}/generate", json=body)
        response.raise_for_status()
        answer = response.json()
        results = answer if isinstance(answer, list) else [answer]
        if len(results) != n:
            raise ValueError(f"{server.label}: /generate answered {len(results)} results for n={n}")
        try:
            return [_completion(result, server) for result in results]
        except (TypeError, AttributeError, IndexError) as exc:  # an answer of another shape: the pool retries
            raise ValueError(f"{server.label}: /generate answered {response.text[:300]!r} "
                             f"({type(exc).__name__}: {exc})") from exc

    async def probe_logprobs(self, client: httpx.AsyncClient, server: Server, probe_ids: list[int],
                             timeout: float) -> list[float]:
        """`POST /generate` with `logprob_start_len: 0` (greedy, 1 new token): `meta_info.input_token_logprobs` is
        `[[null, id_0, null], [logprob_1, id_1, null], ...]`, the raw log-softmax of each prompt token given the
        ones before it (the first has none). SGLang recomputes the prompt from `logprob_start_len` even when its
        prefix is cached."""
        if len(probe_ids) < 2:
            raise ValueError("a probe needs at least 2 tokens (the first one has no logprob)")
        what = "probe logprobs"
        body = {"input_ids": list(probe_ids), "sampling_params": {"temperature": 0, "max_new_tokens": 1},
                "return_logprob": True, "logprob_start_len": 0, **_adapter_field(server)}
        response = await call(client, server, "POST", "/generate", what, timeout, json=body)
        try:
            entries = answer_json(response, server, what)["meta_info"]["input_token_logprobs"]
            values = [entry[0] for entry in entries[1:]]
            ids = [entry[1] for entry in entries]
        except (KeyError, TypeError, IndexError) as exc:
            raise StepError(f"{server.label}: {what} answered {response.text[:500]}") from exc
        if ids != list(probe_ids) or any(v is None for v in values):
            raise StepError(f"{server.label}: {what} do not cover the {len(probe_ids) - 1} probe tokens: "
                            f"{response.text[:500]}")
        return [float(v) for v in values]

    async def score_tokens(self, client: httpx.AsyncClient, server: Server, sequences: list[list[int]],
                           starts: list[int], topk: int, timeout: float) -> list[TokenScores]:
        """`/generate` with `logprob_start_len: 0` and `top_logprobs_num`, a batch of input_ids in one request
        (rlkit.servers.scoring)."""
        from rlkit.servers import scoring

        what = f"scoring {len(sequences)} sequences"
        response = await call(client, server, "POST", "/generate", what, timeout,
                              json=scoring.sglang_body(sequences, topk, _adapter_field(server)))
        return scoring.sglang_scores(answer_json(response, server, what), server, sequences, starts, topk)

    async def pause(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`POST /pause_generation {"mode": "retract"}` (io_struct.PauseGenerationReqInput; Scheduler.pause_generation):
        running requests go back to the waiting queue with their KV freed and wait; nothing is dropped."""
        await call(client, server, "POST", "/pause_generation", "pause (mode retract)", timeout,
                   json={"mode": "retract"})

    async def resume(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`POST /continue_generation {}` (TokenizerManager.continue_generation): clears the pause flag, also when
        none was set."""
        await call(client, server, "POST", "/continue_generation", "resume", timeout, json={})

    async def load_weights_from_disk(self, client: httpx.AsyncClient, server: Server, weights_dir: Path,
                                     version: int, timeout: float, *, delta: DeltaHeader | None = None
                                     ) -> dict[str, Any]:
        """`POST /update_weights_from_disk {"model_path", "weight_version", "flush_cache": true,
        "abort_all_requests": false}` (io_struct.UpdateWeightFromDiskReqInput). While paused the tokenizer manager
        runs it at once (TokenizerManager.update_weights_from_disk skips its writer lock when `is_pause`); the
        scheduler loads in place (DefaultModelLoader), sets the version and flushes the cache, and answers
        `success: false` (HTTP 400) if the flush was refused, so a load never leaves old KV silently."""
        _no_delta(server, delta)
        weights_dir = Path(weights_dir).absolute()  # the server resolves relative paths against its own cwd
        body = {"model_path": str(weights_dir), "weight_version": str(version), "flush_cache": True,
                "abort_all_requests": False}
        response = await call(client, server, "POST", "/update_weights_from_disk",
                              f"the weight reload from {weights_dir}", timeout, json=body)
        answer = answer_json(response, server, "the weight reload")
        if not isinstance(answer, dict) or answer.get("success") is not True:
            raise StepError(f"{server.label}: /update_weights_from_disk answered {answer!r}")
        return answer

    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None:
        """`POST /init_weights_update_group {"master_address", "master_port", "rank_offset", "world_size",
        "group_name", "backend"}` (io_struct.InitWeightsUpdateGroupReqInput): each TP worker joins with rank
        `rank_offset + tp_rank` through `init_custom_process_group(init_method="tcp://addr:port")`
        (model_runner_components/weight_updater.py). SGLang gives the group torch's default timeout; rlkit's own
        bound is `timeout` on this call."""
        body = {"master_address": group.master_address, "master_port": group.master_port,
                "rank_offset": group.rank_offset, "world_size": group.world_size, "group_name": group.group_name,
                "backend": group.backend}
        await _succeeded(client, server, "/init_weights_update_group", f"joining weight group {group.group_name}",
                         timeout, body)

    async def begin_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`POST /begin_weight_update {}` (io_struct.BeginWeightUpdateReqInput): opens the update session the
        distributed route requires; refused while another session is open."""
        await _succeeded(client, server, "/begin_weight_update", "opening the weight-update session", timeout, {})

    def open_weight_link(self, group: WeightGroup) -> WeightLink:
        from rlkit.servers.sglang.weight_group import SglangWeightLink

        return SglangWeightLink(group)

    async def receive_weight_bucket(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                    tensors: list[TensorMeta], timeout: float, *, push: str = "",
                                    delta: DeltaHeader | None = None) -> None:
        """`POST /update_weights_from_distributed {"names", "dtypes", "shapes", "group_name", "flush_cache": false}`
        (io_struct.UpdateWeightsFromDistributedReqInput): the worker receives each tensor by
        `torch.distributed.broadcast(src=0)` in this order, then `model.load_weights` (a tied head is the embedding
        module itself in SGLang's Qwen2, so it follows). The cache is flushed once, by `reset_prefix_cache`, not per
        bucket. A bucket sent again after a failure is loaded again (a plain copy): `push` is not needed."""
        _no_delta(server, delta)
        if not tensors:
            raise ValueError("an empty bucket")
        body = {"names": [t.name for t in tensors], "dtypes": [t.dtype for t in tensors],
                "shapes": [list(t.shape) for t in tensors], "group_name": group.group_name,
                "flush_cache": False, "abort_all_requests": False}
        await _succeeded(client, server, "/update_weights_from_distributed",
                         f"a weight bucket of {len(tensors)} tensors", timeout, body)

    async def finish_weight_broadcast(self, client: httpx.AsyncClient, server: Server, version: int,
                                      timeout: float) -> None:
        """`POST /end_weight_update {}` (closes the session; post-load processing per runner), then
        `POST /update_weight_version {"new_version", "abort_all_requests": false}` (its default would abort every
        held request)."""
        await _succeeded(client, server, "/end_weight_update", "closing the weight-update session", timeout, {})
        await _succeeded(client, server, "/update_weight_version", f"setting the weight version to {version}",
                         timeout, {"new_version": str(version), "abort_all_requests": False})

    async def abort_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`POST /end_weight_update {}`: the session a failed broadcast left open would make the next
        `/begin_weight_update` refuse. Called only for a server whose begin succeeded (SGLang also refuses an end
        without a begin); best effort."""
        try:
            await _succeeded(client, server, "/end_weight_update", "closing a failed weight update", timeout, {})
        except StepError as exc:
            logging.getLogger(__name__).warning("%s", exc)

    async def load_adapter(self, client: httpx.AsyncClient, server: Server, name: str, adapter_dir: Path,
                           version: int, timeout: float) -> dict[str, Any]:
        """`POST /load_lora_adapter {"lora_name", "lora_path"}`, then the version (rlkit.servers.sglang.lora.load)."""
        return await lora.load(client, server, name, Path(adapter_dir).absolute(), version, timeout)

    async def unload_adapter(self, client: httpx.AsyncClient, server: Server, name: str, timeout: float) -> bool:
        """`POST /unload_lora_adapter {"lora_name"}`; waits for the requests running with it to finish."""
        return await lora.unload(client, server, name, timeout)

    async def list_adapters(self, client: httpx.AsyncClient, server: Server, timeout: float) -> list[str]:
        """`GET /v1/models`: the cards with a `parent`."""
        return await lora.listed(client, server, timeout)

    async def reset_prefix_cache(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """`POST /flush_cache`: 200 "Cache flushed..." only when the scheduler flushed (radix tree, KV pools);
        400 when requests hold KV (call `pause` first: a retract pause frees theirs). StepError unless flushed."""
        response = await call(client, server, "POST", "/flush_cache", "the prefix cache flush", timeout)
        if not response.text.startswith("Cache flushed"):
            raise StepError(f"{server.label}: /flush_cache answered {response.text[:300]!r}: KV computed "
                            "with the old weights could be reused")

    async def read_version(self, client: httpx.AsyncClient, server: Server, timeout: float) -> str | None:
        """`GET /model_info`'s `weight_version` (http_server.model_info): "default" until a load or
        `/update_weight_version` sets one."""
        response = await call(client, server, "GET", "/model_info", "the model info", timeout)
        body = answer_json(response, server, "the model info")
        if not isinstance(body, dict) or "weight_version" not in body:
            raise StepError(f"{server.label}: /model_info has no weight_version: {response.text[:300]}")
        version = body["weight_version"]
        return None if version is None else str(version)


async def _succeeded(client: httpx.AsyncClient, server: Server, route: str, what: str, timeout: float,
                     body: dict[str, Any]) -> dict[str, Any]:
    """POST `body` to one of SGLang's `{"success", "message"}` routes; StepError unless `success` is true."""
    response = await call(client, server, "POST", route, what, timeout, json=body)
    answer = answer_json(response, server, what)
    if not isinstance(answer, dict) or answer.get("success") is not True:
        raise StepError(f"{server.label}: {what} ({route}) answered {response.text[:500]}")
    return answer


def _adapter_field(server: Server) -> dict[str, str]:
    """What names the adapter in a `/generate` body: `lora_path` (SGLang looks the NAME up among the loaded
    adapters), nothing for the base model."""
    return {"lora_path": server.adapter} if server.adapter else {}


def _completion(result: Any, server: Server) -> Completion:
    """One `/generate` result as a Completion; ValueError for a result of the wrong shape or an aborted one."""
    if not isinstance(result, dict):
        raise ValueError(f"{server.label}: /generate answered {result!r:.300}")
    meta = result["meta_info"]
    finish = meta.get("finish_reason") or {}
    reason = finish.get("type", "") if isinstance(finish, dict) else str(finish)
    if reason == "abort":
        raise ValueError(f"{server.label}: the server aborted the request ({finish.get('message', '')})")
    token_ids = [int(t) for t in result["output_ids"]]
    entries = meta["output_token_logprobs"]
    if [int(e[1]) for e in entries] != token_ids:
        raise ValueError(f"{server.label}: output_token_logprobs do not match output_ids")
    return Completion(text=result.get("text", ""), token_ids=token_ids, logprobs=[float(e[0]) for e in entries],
                      finish_reason=reason)


def _no_delta(server: Server, delta: DeltaHeader | None) -> None:
    """SGLang loads pushes through its own routes, which take whole tensors: a delta push cannot reach it (refused
    at submit by rlkit.checks.weight_delta; this guards the API)."""
    if delta is not None:
        raise StepError(f"{server.label}: SGLang takes whole weights only; actor.weight_update_delta needs vLLM "
                        "servers\n  fix: set actor.weight_update_delta: false, or serve with vLLM")


BACKEND = SglangBackend()
