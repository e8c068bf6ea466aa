"""The one interface every inference-server engine implements (vLLM, SGLang), and the registry that picks one by name.

Everything rlkit does with a server goes through a `ServerBackend`: how the serve step starts it (argv, environment,
secret files), how its token guard is proven, how the rollout client asks for completions with token ids and
log-probs, how weights reach it (a directory on the shared filesystem, or a broadcast from trainer rank 0), which
version it reports, how its prefix cache is reset and how the fingerprint probe is asked. Outside `rlkit.servers`
nothing switches on the backend's name: callers hold a backend object (`backend_for(name)`).

This module is light (no torch, no vLLM, no SGLang): config validation, the planner and `rlkit status` import it.
Each backend lives in its own package (`rlkit.servers.vllm`, `rlkit.servers.sglang`); its `backend` module is
imported on first use.

Request methods are coroutines that take an `httpx.AsyncClient` carrying the trial's bearer token
(`rlkit.servers.http.server_client`). Unless said otherwise they raise `ServerUnreachable` when the server's process
is gone (connection refused or dropped) and `StepError` naming the server, the route and what was asked for any
other failure (timeout, non-2xx answer, an answer of the wrong shape).
"""

from __future__ import annotations

import importlib
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, Protocol

from rlkit.config.allocation import SERVER_BACKENDS, Allocation
from rlkit.config.model_config import model_positions
from rlkit.nameresolve.servers import http_url

if TYPE_CHECKING:
    import httpx
    from torch import Tensor

    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.servers.weight_delta import DeltaHeader


LogprobMeaning = Literal["raw", "temperature", "logits"]


@dataclass
class Server:
    """One registered inference server (from name resolve), with the pool's bookkeeping."""

    index: int
    address: str  # host:port, checked by rlkit.nameresolve.servers.check_address
    model: str  # the model name requests must carry (vLLM's served name)
    backend: str
    in_flight: int = 0
    failures: int = 0
    # The LoRA adapter this server serves the current weight version under (actor.use_lora), set by the adapter
    # transport (rlkit.weights.lora_disk) once the server loaded it; None: the base model's weights.
    adapter: str | None = None

    @property
    def request_model(self) -> str:
        """The `model` every completion and probe request names: the current adapter, else the served model."""
        return self.adapter or self.model

    @property
    def url(self) -> str:
        return http_url(self.address)

    @property
    def label(self) -> str:
        return f"server {self.index} ({self.address})"


@dataclass(frozen=True)
class Completion:
    """One sampled completion with its tokens and their log-probabilities under the server's weights."""

    text: str
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str


@dataclass(frozen=True)
class TokenScores:
    """A model's scores of a given token sequence (a teacher's, job type distill): the raw log-prob of each token
    from position `start` on given the ones before it, and at each of those positions its `topk` most likely
    (token id, log-prob) pairs, most likely first (empty lists when none were asked for)."""

    logprobs: list[float]
    topk: list[list[tuple[int, float]]]


@dataclass
class SamplingParams:
    """The sampling settings of a request (gconfig)."""

    n: int = 1
    max_new_tokens: int = 256
    min_new_tokens: int = 0  # EOS cannot end a completion before this many tokens; 0: off
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: list[str] = field(default_factory=list)
    seed: int | None = None  # per-request sampling seed: the same request gives the same completions


@dataclass(frozen=True)
class ServerLaunch:
    """What the serve step runs: the argv and the variables to add to the environment (secrets never in argv)."""

    argv: list[str]
    env: dict[str, str]
    unset_env: tuple[str, ...] = ()  # variables to remove from the inherited environment


@dataclass(frozen=True)
class WeightGroup:
    """Where one server's workers join the trainer's weight-broadcast group (rlkit.weights.xccl).

    Trainer rank 0 is rank 0 of the group and hosts its TCPStore; the server's workers take ranks
    `rank_offset .. rank_offset + tp - 1`. One group holds every server of a push: the servers differ only in
    `rank_offset` (server i of the group: 1 + i * tp).
    """

    master_address: str
    master_port: int
    rank_offset: int
    world_size: int
    group_name: str
    backend: str  # torch.distributed backend: "nccl" on GPUs, "gloo" on the CPU
    timeout_s: float  # every collective of the group gives up after this


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a broadcast bucket, in the order the trainer sends them."""

    name: str  # Hugging Face parameter name (model.layers.0.mlp.up_proj.weight)
    dtype: str  # torch dtype name without the prefix: "bfloat16", "float32"
    shape: tuple[int, ...]


class WeightLink(Protocol):
    """Trainer rank 0's end of a weight-broadcast group (`ServerBackend.open_weight_link`)."""

    copies: int  # how many copies of each byte rank 0 sends, whatever the number of servers (the bytes reported)

    def send(self, tensors: list[Tensor]) -> None:
        """Broadcast one bucket's tensors from rank 0, in order, as the engine's workers expect them; raises (within
        the group's timeout where the backend has one) if the group breaks."""

    def close(self) -> None:
        """Leave the group (also a broken one); the next push forms a new group for its servers."""


class ServerBackend(ABC):
    """One inference engine, as rlkit drives it. Subclasses are stateless: one instance serves every server."""

    name: ClassVar[str]  # "vllm", "sglang": the allocation_mode prefix and the config section
    model_field: ClassVar[str]  # the config field naming the model it serves when not actor.path ("vllm.model")
    context_field: ClassVar[str]  # the config field bounding prompt + completion tokens ("vllm.max_model_len")
    guard_probe: ClassVar[str]  # a side-effect-free GET route that must answer 401 without the token
    guard_hint: ClassVar[str]  # what to check when the guard probe is not refused
    # Whether the server's prefix cache keys an adapter's KV by its name and path (vLLM), so that an adapter loaded
    # again under a name it had before could meet KV of the old weights: the adapter transport then resets the cache
    # on its first push (rlkit.weights.lora_disk). False where every load gets a fresh key (SGLang's lora_id).
    adapter_cache_by_name: ClassVar[bool] = True
    # The variables `launch` sets or removes itself (the token, the routes it needs): `<backend>.env_vars` must not
    # name them, or the user's value would be silently replaced (rlkit.servers.engine_env).
    launch_env_names: ClassVar[tuple[str, ...]] = ()

    # ---- config side (pure, no server needed) ----

    @abstractmethod
    def configured_model(self, config: ExperimentConfig) -> str | None:
        """The model the config names in this backend's section (None/empty: serve actor.path)."""

    @abstractmethod
    def context_length(self, config: ExperimentConfig) -> int | None:
        """The configured bound on prompt + completion tokens, if any."""

    @abstractmethod
    def extra_args_problems(self, extra: Mapping[str, object]) -> list[tuple[str, str]]:
        """(field, message) for every refused entry of `<backend>.extra_args`."""

    def lora_problems(self, config: ExperimentConfig) -> list[tuple[str, str]] | None:
        """(message, fix) for every setting this backend's LoRA path cannot serve (actor.use_lora); None: it loads
        no adapters at all. Asked at submit by rlkit.checks.lora, so a new backend says what it supports here."""
        return None

    @abstractmethod
    def serving_dtype(self, config: ExperimentConfig) -> str:
        """The dtype the configured servers compute in ("float32", "bfloat16", "auto", ...): how close their log-probs
        can be to a float32 trainer's (the fingerprint's and the mismatch warning's default tolerances)."""

    @abstractmethod
    def sampled_logprob_meaning(self, config: ExperimentConfig) -> LogprobMeaning:
        """What the log-prob the server returns with a sampled token is: of the model's raw distribution, of the
        temperature-scaled one, or logits (no log-probs at all). The trainer reproduces them to compare
        (rlkit.trainer.mismatch), and the PPO loss uses them as the behaviour policy."""

    @abstractmethod
    def launch(self, config: ExperimentConfig, *, python: str, model: str, host: str, port: int, tp: int,
               token: str, secret_dir: Path, index: int) -> ServerLaunch:
        """The server's argv and environment. Any file holding the token is written 0600 into `secret_dir`."""

    # ---- requests ----

    @abstractmethod
    async def complete(self, client: httpx.AsyncClient, server: Server, prompt_ids: list[int],
                       params: SamplingParams) -> list[Completion]:
        """`params.n` completions of a tokenized prompt with per-token log-probs, in the server's order.

        Raises httpx errors as they come (the rollout pool retries on another server) and ValueError/KeyError for an
        answer of the wrong shape; the client's timeout applies."""

    @abstractmethod
    async def probe_logprobs(self, client: httpx.AsyncClient, server: Server, probe_ids: list[int],
                             timeout: float) -> list[float]:
        """The raw log-prob of each probe token given the ones before it (`len(probe_ids) - 1` values)."""

    async def score_tokens(self, client: httpx.AsyncClient, server: Server, sequences: list[list[int]],
                           starts: list[int], topk: int, timeout: float) -> list[TokenScores]:
        """One request scoring several token sequences with the server's prompt-logprob route: per sequence, the
        log-probs of its tokens from `starts[i]` on (`start >= 1`) and, with `topk`, the top-k per position. Errors
        as for `probe_logprobs`."""
        raise NotImplementedError(f"the {self.name} backend does not score token sequences (a distillation teacher "
                                  "needs vLLM or SGLang servers)")

    async def pooling(self, client: httpx.AsyncClient, server: Server, ids: list[int], task: str) -> list[float]:
        """A pooling server's output for `ids` under `task` (a reward model: "token_classify", one value per token;
        "classify", one value), no activation applied; httpx errors, or ValueError for an answer of another shape, as
        `complete` raises them (the pool retries)."""
        raise NotImplementedError(f"the {self.name} backend does not serve reward models (rlkit runs them on vLLM)")

    @abstractmethod
    async def pause(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """Stop scheduling: requests in flight are held (not dropped) until `resume`."""

    @abstractmethod
    async def resume(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """Undo `pause`; idempotent (also for a server that is not paused)."""

    @abstractmethod
    async def load_weights_from_disk(self, client: httpx.AsyncClient, server: Server, weights_dir: Path,
                                     version: int, timeout: float, *, delta: DeltaHeader | None = None
                                     ) -> dict[str, Any]:
        """While paused: load the Hugging Face checkpoint in `weights_dir` in place and set the reported version to
        `version`. Returns what the server reported (JSON-able, for the log). `delta` (actor.weight_update_delta):
        the push's header; `weights_dir` then holds a full checkpoint (kept by the server) or a delta against it
        (rlkit.servers.weight_delta). A backend without a delta receive path raises StepError."""

    @abstractmethod
    async def join_weight_group(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                timeout: float) -> None:
        """Have the server's workers join `group`. Returns once they joined; the trainer joins at the same time (this
        call is made from another task while the trainer's rank waits in the group's rendezvous)."""

    @abstractmethod
    def open_weight_link(self, group: WeightGroup) -> WeightLink:
        """Trainer rank 0 (in a thread, while `join_weight_group` runs): host the group's rendezvous and join it as
        rank 0; returns once every worker joined, raises after `group.timeout_s`. Each engine lays out its group (store
        keys, packing) its own way, so the trainer's end belongs to the backend."""

    @abstractmethod
    async def begin_weight_broadcast(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """While paused, before the first bucket of a version."""

    @abstractmethod
    async def receive_weight_bucket(self, client: httpx.AsyncClient, server: Server, group: WeightGroup,
                                    tensors: list[TensorMeta], timeout: float, *, push: str = "",
                                    delta: DeltaHeader | None = None) -> None:
        """Receive one bucket: returns when the server's workers received and loaded every tensor of `tensors`,
        broadcast by trainer rank 0 in that order (concurrently with this call) over the joined group. `push` names
        the push (the same for all its buckets, also one sent again after a failure): an engine that skips tensors
        it loaded already in the push (rlkit's gloo engine) tells a resumed push from a new one by it. `delta`: as
        for `load_weights_from_disk`, the tensors being a bucket of the push in its wire format."""

    @abstractmethod
    async def finish_weight_broadcast(self, client: httpx.AsyncClient, server: Server, version: int,
                                      timeout: float) -> None:
        """After the last bucket: finalize the load (e.g. tied layers) and set the reported version to `version`."""

    async def abort_weight_broadcast(self, client: httpx.AsyncClient, server: Server,  # noqa: B027 - optional
                                     timeout: float) -> None:
        """After a broadcast failed on a live server that began it: close its weight update, so its next begin (the
        next push) is not refused. Best effort, never raises; by default nothing (vLLM's begin closes a stale one)."""

    # ---- LoRA adapters (actor.use_lora): a new adapter name per weight version, base weights untouched ----
    # Not abstract: a backend without adapter loading keeps these, and validation (rlkit.checks.lora)
    # refuses use_lora with such servers at submit, so they are reached only by a misuse of the API. vLLM and SGLang
    # implement them.

    async def load_adapter(self, client: httpx.AsyncClient, server: Server, name: str, adapter_dir: Path,
                           version: int, timeout: float) -> dict[str, Any]:
        """Load the peft adapter directory `adapter_dir` under `name` (a name not loaded yet) and set the reported
        weight version to `version`; requests naming `name` then use it. Returns what the server reported."""
        raise NotImplementedError(f"the {self.name} backend does not load LoRA adapters (actor.use_lora needs vLLM "
                                  "or SGLang servers)")

    async def unload_adapter(self, client: httpx.AsyncClient, server: Server, name: str, timeout: float) -> bool:
        """Forget the adapter `name`: later requests naming it are refused (requests already running finish with
        it; SGLang 0.5.23 instead loads it again from its directory for such a request). False if the server had no
        such adapter."""
        raise NotImplementedError(f"the {self.name} backend does not load LoRA adapters")

    async def list_adapters(self, client: httpx.AsyncClient, server: Server, timeout: float) -> list[str]:
        """The names of the adapters the server has loaded."""
        raise NotImplementedError(f"the {self.name} backend does not load LoRA adapters")

    @abstractmethod
    async def reset_prefix_cache(self, client: httpx.AsyncClient, server: Server, timeout: float) -> None:
        """Drop every cached KV block, also of held requests (they recompute with the new weights): after every
        weight change, before the server takes a request. StepError if the server does not confirm it."""

    @abstractmethod
    async def read_version(self, client: httpx.AsyncClient, server: Server, timeout: float) -> str | None:
        """The weight version the server reports (None if it reports none)."""


BACKEND_NAMES: tuple[str, ...] = SERVER_BACKENDS  # the engines allocation_mode names (rlkit.config.allocation)
# each engine's package rlkit.servers.<name> has a `backend` module exposing BACKEND, a ServerBackend instance
_BACKENDS = {name: f"rlkit.servers.{name}.backend" for name in BACKEND_NAMES}


def backend_for(name: str) -> ServerBackend:
    """The backend called `name` (the allocation_mode prefix); ValueError naming the known ones."""
    module = _BACKENDS.get(name)
    if module is None:
        raise ValueError(f"unknown server backend {name!r}; known: {', '.join(BACKEND_NAMES)}")
    backend = importlib.import_module(module).BACKEND
    if not isinstance(backend, ServerBackend):
        raise TypeError(f"{module}.BACKEND is not a ServerBackend")
    return backend


def server_model(config: ExperimentConfig, backend: str) -> str:
    """The model the inference servers of `backend` load (the backend's own field, else actor.path)."""
    return backend_for(backend).configured_model(config) or config.actor.path


def servers_context(config: ExperimentConfig, allocation: Allocation | None) -> int | None:
    """The servers' context length (their setting, else the model's max_position_embeddings); None when unknown."""
    if allocation is None or allocation.server is None:
        return None
    backend = backend_for(allocation.server.backend)
    model = server_model(config, backend.name)
    return backend.context_length(config) or model_positions(model)
