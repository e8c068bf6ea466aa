"""Auxiliary models for user code: `auxiliary_model("judge").generate(prompt)` inside a reward function.

An auxiliary model (config `auxiliary_models`, rlkit.config.schema.auxiliary) is served by its own servers in the
trial's job, registered as `auxiliary/<name>/<index>` in name resolve. Reward functions run in worker processes
(rlkit.rewards.runner), so everything is found from the trial directory the trainer hands its workers in
$RLKIT_TRIAL_DIR: the config (where name resolve is, the model), and the trial token, read from its 0600 file
(never on a command line or in the environment). Requests go through rlkit.servers.pool's ServerPool (least busy
server, retries on another one), so the backends' wire code is the one the rollouts use.

Nothing happens at `auxiliary_model()`: a reward module may call it at import, including at submit on the login
node, where no server exists. The first request waits for a live server. Torch-free; transformers is imported only
to tokenize a text or chat prompt.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from rlkit.config.served_models import served_auxiliary_models
from rlkit.errors import StepError
from rlkit.servers.backend import Completion, SamplingParams

if TYPE_CHECKING:
    from rlkit.config.schema.auxiliary import AuxiliaryModelConfig
    from rlkit.config.schema.experiment import ExperimentConfig
    from rlkit.nameresolve.base import NameResolve
    from rlkit.servers.pool import ServerPool

TRIAL_DIR_ENV = "RLKIT_TRIAL_DIR"  # set by the trainer for its reward workers (rlkit.jobs.grpo.rank0)
REFRESH_S = 10.0  # how often the live servers are read again (a restarted server comes back at a new address)
_SAMPLING = tuple(f.name for f in dataclasses.fields(SamplingParams))

Prompt = str | list[int] | list[dict[str, str]]
_T = TypeVar("_T")


class AuxiliaryModelError(StepError):
    """An auxiliary model cannot be reached: no trial, no such name, or no live server."""


def trial_environment(trial_dir: str | Path) -> dict[str, str]:
    """What a reward worker needs in its environment to reach the trial's auxiliary models."""
    return {TRIAL_DIR_ENV: str(trial_dir)}


class AuxiliaryModel:
    """The servers of one auxiliary model of the running trial. `generate` gives texts, `complete` Completions
    (text, token ids, log-probs, finish reason); `agenerate`/`acomplete` are the same for async code.

    A prompt is a string (tokenized as the rollouts tokenize prompts, without a chat template), a list of chat
    messages (the model's chat template, with the generation prompt), or token ids. Sampling keywords are those of
    rlkit.servers.backend.SamplingParams: n, max_new_tokens, min_new_tokens, temperature, top_p, top_k, stop, seed.
    """

    def __init__(self, name: str, trial_dir: str | Path | None = None) -> None:
        self.name = name
        self._trial_dir = trial_dir
        self._entry: AuxiliaryModelConfig | None = None
        self._config: ExperimentConfig | None = None
        self._token = ""
        self._nr: NameResolve | None = None
        self._tokenizer: Any = None
        self._pool: ServerPool | None = None
        self._pool_loop: asyncio.AbstractEventLoop | None = None
        self._refreshed = 0.0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()  # setup and the tokenizer load run in helper threads (asyncio.to_thread)

    # ---- sync -------------------------------------------------------------------------------------------------

    def generate(self, prompt: Prompt, **sampling: Any) -> list[str]:
        """The texts of `n` (default 1) completions of `prompt`."""
        return [c.text for c in self.complete(prompt, **sampling)]

    def complete(self, prompt: Prompt, **sampling: Any) -> list[Completion]:
        """`n` (default 1) completions of `prompt` with their token ids and log-probs."""
        return self._run(self.acomplete(prompt, **sampling))

    def warmup(self) -> None:
        """Read the trial, load the tokenizer and find a live server now: give it to a reward function as its
        `warmup` (`fn.warmup = model.warmup`), so its first call is not charged with them (reward.timeout)."""
        self._prompt_ids("")
        self._run(self._live_pool())

    def _run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run `coroutine` on this client's own event loop (the blocking methods)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            pass
        else:
            coroutine.close()
            raise RuntimeError(f"auxiliary model {self.name}: generate/complete block, and this thread runs an event "
                               "loop: use `await model.agenerate(...)` or `await model.acomplete(...)` there")
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(coroutine)

    # ---- async ------------------------------------------------------------------------------------------------

    async def agenerate(self, prompt: Prompt, **sampling: Any) -> list[str]:
        return [c.text for c in await self.acomplete(prompt, **sampling)]

    async def acomplete(self, prompt: Prompt, **sampling: Any) -> list[Completion]:
        params = sampling_params(sampling)
        prompt_ids = await asyncio.to_thread(self._prompt_ids, prompt)
        return await self._ask(lambda pool: pool.complete(prompt_ids, params))

    def pooling(self, ids: list[int], task: str) -> list[float]:
        """A pooling server's output for `ids` under `task` (the reward model's servers: rlkit.rewards.model_reward)."""
        return self._run(self.apooling(ids, task))

    async def apooling(self, ids: list[int], task: str) -> list[float]:
        return await self._ask(lambda pool: pool.pooling(ids, task))

    async def _ask(self, request: Callable[[ServerPool], Awaitable[tuple[Any, _T]]]) -> _T:
        """`request` on the live pool; once more after a refresh when every server it knew is gone (restarted
        ones register again at new addresses)."""
        from rlkit.servers.pool import ServersUnreachable

        pool = await self._live_pool()
        try:
            return (await request(pool))[1]
        except ServersUnreachable:
            await self._refresh(pool, force=True)
            return (await request(pool))[1]

    def close(self) -> None:
        """Close the connections and the name-resolve handle (a worker that exits needs not call it)."""
        if self._pool is not None and self._pool_loop is not None and not self._pool_loop.is_closed():
            self._pool_loop.run_until_complete(self._pool.aclose())
        self._pool = self._pool_loop = None
        if self._loop is not None and not self._loop.is_closed():
            self._loop.close()
        if self._nr is not None:
            self._nr.close()
            self._nr = None

    # ---- setup ------------------------------------------------------------------------------------------------

    def _setup(self) -> None:
        """Read the trial's config and token (once per process)."""
        with self._lock:
            if self._entry is None:
                self._read_trial()

    def _read_trial(self) -> None:
        from rlkit.config.load import load_config
        from rlkit.nameresolve import name_resolve_for
        from rlkit.trials.paths import TrialPaths
        from rlkit.trials.records import read_token

        trial_dir = self._trial_dir or os.environ.get(TRIAL_DIR_ENV, "")
        if not trial_dir:
            raise AuxiliaryModelError(f"auxiliary model {self.name}: ${TRIAL_DIR_ENV} is not set; auxiliary models "
                                      "are reached from a trial's reward functions (the trainer sets it for them)")
        paths = TrialPaths(Path(trial_dir))
        config = load_config(paths.config)
        served = served_auxiliary_models(config)
        entry = next((e for e in served if e.name == self.name), None)
        if entry is None:
            names = ", ".join(e.name for e in served) or "none"
            raise AuxiliaryModelError(f"the trial has no auxiliary model '{self.name}' (auxiliary_models: {names})")
        self._config, self._token, self._nr, self._entry = config, read_token(paths), name_resolve_for(config), entry

    def _prompt_ids(self, prompt: Prompt) -> list[int]:
        from rlkit.data.files import prompt_token_ids

        self._setup()
        assert self._entry is not None
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(cast(list[int], prompt))  # token ids need no tokenizer
        with self._lock:
            if self._tokenizer is None:
                from transformers import AutoTokenizer

                self._tokenizer = AutoTokenizer.from_pretrained(self._entry.model_path)
        return prompt_token_ids(prompt, self._tokenizer, chat_template=False)

    async def _live_pool(self) -> ServerPool:
        """This event loop's pool over the live servers (waiting for the first one), refreshed every REFRESH_S."""
        from rlkit.servers.pool import ServerPool, wait_for_servers

        self._setup()
        assert self._config is not None and self._nr is not None
        loop = asyncio.get_running_loop()
        if self._pool is None or self._pool_loop is not loop:  # an httpx client belongs to one event loop
            rollout = self._config.rollout
            servers = await asyncio.to_thread(wait_for_servers, self._nr, 1, rollout.setup_timeout,
                                              auxiliary=self.name)
            self._pool = ServerPool(servers, self._token, timeout=rollout.request_timeout,
                                    retries=rollout.request_retries, max_in_flight=rollout.max_concurrent_rollouts)
            self._pool_loop, self._refreshed = loop, time.monotonic()
        await self._refresh(self._pool)
        return self._pool

    async def _refresh(self, pool: ServerPool, *, force: bool = False) -> None:
        from rlkit.servers.pool import discover_servers

        if not force and time.monotonic() - self._refreshed < REFRESH_S:
            return
        assert self._nr is not None
        pool.set_servers(await asyncio.to_thread(discover_servers, self._nr, self.name))
        self._refreshed = time.monotonic()


def sampling_params(sampling: dict[str, Any]) -> SamplingParams:
    """SamplingParams from keywords; an unknown keyword is a TypeError naming the known ones."""
    unknown = sorted(set(sampling) - set(_SAMPLING))
    if unknown:
        raise TypeError(f"unknown sampling keyword(s) {', '.join(unknown)}; known: {', '.join(_SAMPLING)}")
    return SamplingParams(**sampling)


_MODELS: dict[str, AuxiliaryModel] = {}


def auxiliary_model(name: str) -> AuxiliaryModel:
    """The auxiliary model `name` of the running trial (one client per process and name)."""
    if name not in _MODELS:
        _MODELS[name] = AuxiliaryModel(name)
    return _MODELS[name]


def wait_for_auxiliary(config: ExperimentConfig, nr: NameResolve, timeout: float) -> dict[str, list[str]]:
    """Wait until every server of every auxiliary model is registered and healthy (the trainer, before the first
    rollout, so no reward function meets a server still starting); their addresses by model name."""
    from rlkit.servers.pool import wait_for_servers

    deadline = time.monotonic() + timeout
    found = {}
    for entry in served_auxiliary_models(config):
        servers = wait_for_servers(nr, entry.engine_num, max(1.0, deadline - time.monotonic()), healthy=True,
                                   auxiliary=entry.name)
        found[entry.name] = [s.address for s in servers]
    return found
