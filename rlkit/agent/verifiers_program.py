"""One verifiers episode, run as a program in the verifiers venv (scripts/verifiers-env.sh), never imported by rlkit.

rlkit (rlkit.agent.verifiers_workflow) runs `python verifiers_program.py` once per episode with a JSON spec on stdin:
the environment (`environment`: the taskset id, played by one agent; `args`: the taskset's config), the harness,
the task (`task`: its index in the taskset), the episode's base URL on rlkit's agent endpoint and the tokenizer
directory. It builds the environment as verifiers' own entry points do (`load_environment`), runs
`Env.run_episode(task, ModelContext(model, TrainClientConfig(...), sampling))` (the train client posts token ids to
`<base_url>/inference/v1/generate`), and prints one JSON line: whether the episode is ok, its errors, and per trace
its reward and trainable branches (token_ids, sampled_mask, logprobs). Standard library plus verifiers only: this
file runs under another interpreter than rlkit's.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


def _branches(trace: Any) -> list[dict[str, Any]]:
    return [{"token_ids": list(b.token_ids), "sampled_mask": [bool(m) for m in b.sampled_mask],
             "logprobs": [float(x) for x in b.logprobs]} for b in trace.branches if b.trainable]


async def run(spec: dict[str, Any]) -> dict[str, Any]:
    import verifiers.v1 as vf
    from verifiers.v1.utils.loaders import load_environment

    taskset = {**spec["args"], "id": spec["environment"]}
    config = vf.SingleAgentEnvConfig.model_validate({"taskset": taskset, "agent": {
        "harness": {"id": spec["harness"]}, "runtime": {"type": spec["runtime"]}}})
    env = load_environment(config)
    tasks = list(env.taskset)
    index = spec["task"]
    if not 0 <= index < len(tasks):
        raise SystemExit(f"task {index} is not in taskset {spec['environment']!r} ({len(tasks)} tasks)")
    client = vf.TrainClientConfig(base_url=spec["base_url"], api_key_var="RLKIT_EPISODE_KEY",
                                  renderer_model_name=spec["tokenizer"])
    sampling = vf.SamplingConfig(temperature=spec["temperature"], max_tokens=spec["max_tokens"])
    context = vf.ModelContext(model=spec["tokenizer"], client=client, sampling=sampling)
    async with env.serving():
        episode = await env.run_episode(tasks[index], context)
    return {"ok": bool(episode.ok), "errors": [f"{e.type}: {e.message}" for e in episode.errors]
            + [f"{e.type}: {e.message}" for t in episode.traces for e in t.errors],
            "traces": [{"reward": float(t.reward), "branches": _branches(t)} for t in episode.traces]}


def main() -> int:
    spec = json.loads(sys.stdin.read())
    result = asyncio.run(run(spec))
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
