"""verifiers episodes, run by a program in the verifiers venv (scripts/verifiers-env.sh), never imported by rlkit.

rlkit (rlkit.agent.verifiers_workflow) starts `python verifiers_program.py` once per run and writes one JSON line per
episode to its stdin: an `id`, the environment (`environment`: the taskset id, played by one agent; `args`: the
taskset's config), the harness and runtime, the task (`task`: its index in the taskset), the episode's base URL on
rlkit's agent endpoint and the tokenizer directory. The program builds each environment once, as verifiers' own entry
points do (`load_environment`, then `Env.serving()` held for the whole run), and runs the episodes concurrently:
`Env.run_episode(task, ModelContext(model, TrainClientConfig(...), sampling))`, whose train client posts token ids to
`<base_url>/inference/v1/generate`. For each it prints one JSON line: `{"id", "result"}` (whether the episode is ok,
its errors, and per trace its reward and trainable branches: token_ids, sampled_mask, logprobs) or `{"id", "error"}`.
One process for the run because importing verifiers and loading an environment costs ~10 CPU-s, more than an episode
of a small model. It exits when its stdin closes (rlkit stopped). Standard library plus verifiers only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from typing import Any


def _branches(trace: Any) -> list[dict[str, Any]]:
    return [{"token_ids": list(b.token_ids), "sampled_mask": [bool(m) for m in b.sampled_mask],
             "logprobs": [float(x) for x in b.logprobs]} for b in trace.branches if b.trainable]


class Environments:
    """Each environment of the run, loaded once and served until the program ends."""

    def __init__(self, stack: contextlib.AsyncExitStack) -> None:
        self.stack = stack
        self.loaded: dict[str, tuple[Any, list[Any]]] = {}
        self.loading = asyncio.Lock()

    async def get(self, spec: dict[str, Any]) -> tuple[Any, list[Any]]:
        import verifiers.v1 as vf
        from verifiers.v1.utils.loaders import load_environment

        key = json.dumps([spec["environment"], spec["args"], spec["harness"], spec["runtime"]], sort_keys=True)
        async with self.loading:
            if key not in self.loaded:
                taskset = {**spec["args"], "id": spec["environment"]}
                config = vf.SingleAgentEnvConfig.model_validate({"taskset": taskset, "agent": {
                    "harness": {"id": spec["harness"]}, "runtime": {"type": spec["runtime"]}}})
                env = load_environment(config)
                await self.stack.enter_async_context(env.serving())
                self.loaded[key] = (env, list(env.taskset))
        return self.loaded[key]


async def run_episode(environments: Environments, spec: dict[str, Any]) -> dict[str, Any]:
    import verifiers.v1 as vf

    env, tasks = await environments.get(spec)
    index = spec["task"]
    if not 0 <= index < len(tasks):
        raise LookupError(f"task {index} is not in taskset {spec['environment']!r} ({len(tasks)} tasks)")
    client = vf.TrainClientConfig(base_url=spec["base_url"], api_key_var="RLKIT_VERIFIERS_NO_KEY",
                                  renderer_model_name=spec["tokenizer"])  # the key is in the base URL
    sampling = vf.SamplingConfig(temperature=spec["temperature"], max_tokens=spec["max_tokens"])
    episode = await env.run_episode(tasks[index], vf.ModelContext(model=spec["tokenizer"], client=client,
                                                                  sampling=sampling))
    return {"ok": bool(episode.ok), "errors": [f"{e.type}: {e.message}" for e in episode.errors]
            + [f"{e.type}: {e.message}" for t in episode.traces for e in t.errors],
            "traces": [{"reward": float(t.reward), "branches": _branches(t)} for t in episode.traces]}


async def answer(environments: Environments, line: bytes) -> None:
    spec: dict[str, Any] = {}
    try:
        spec = json.loads(line)
        reply: dict[str, Any] = {"id": spec["id"], "result": await run_episode(environments, spec)}
    except Exception as exc:  # the episode's failure, reported to rlkit (which drops it); the others go on
        reply = {"id": spec.get("id"), "error": f"{type(exc).__name__}: {exc}"}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()


async def serve() -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=1 << 24)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    running: set[asyncio.Task[None]] = set()
    async with contextlib.AsyncExitStack() as stack:
        environments = Environments(stack)
        while line := await reader.readline():
            task = asyncio.create_task(answer(environments, line))
            running.add(task)
            task.add_done_callback(running.discard)
        for task in list(running):
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)


if __name__ == "__main__":
    asyncio.run(serve())
