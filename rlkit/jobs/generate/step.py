"""In-job step of job type generate (run by `rlkit client`): complete every prompt of a dataset on the trial's
servers, write a jsonl file."""

from __future__ import annotations

import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.data.files import load_rows, prompt_token_ids
from rlkit.data.row_formats import is_gsm8k_row, rl_prompt
from rlkit.errors import StepError
from rlkit.nameresolve import name_resolve_for
from rlkit.servers.backend import SamplingParams, server_model
from rlkit.servers.pool import ServerPool, wait_for_servers
from rlkit.servers.sampling import sampling_params as request_sampling
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import read_token


def sampling_params(config: ExperimentConfig) -> SamplingParams:
    """gconfig's request settings (rlkit.servers.sampling: greedy decoding as the rollouts and the evaluator)."""
    return request_sampling(config)


async def _complete_all(pool: ServerPool, prompts: list[list[int]], params: SamplingParams,
                        rows: list[dict[str, Any]], prompt_key: str, out: Any) -> dict[int, int]:
    """Run all requests concurrently (bounded by the pool); write one line per prompt as each finishes."""
    per_server: dict[int, int] = {}

    async def one(i: int) -> None:
        server, completions = await pool.complete(prompts[i], params)
        per_server[server.index] = per_server.get(server.index, 0) + 1
        record = {
            "index": i, "prompt": rows[i][prompt_key], "prompt_token_ids": prompts[i], "server": server.index,
            "completions": [{"text": c.text, "token_ids": c.token_ids, "logprobs": c.logprobs,
                             "finish_reason": c.finish_reason} for c in completions],
        }
        out.write(json.dumps(record) + "\n")

    try:
        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    finally:
        await pool.aclose()
    return per_server


def run_generate(trial_dir: Path, config: ExperimentConfig) -> None:
    """Complete the configured dataset; the output file appears (atomically) only when every prompt is done."""
    from transformers import AutoTokenizer

    paths = TrialPaths(Path(trial_dir))
    alloc = parse_allocation(config.allocation_mode)
    assert alloc.server is not None
    gen = config.generate
    rows = load_rows(gen.dataset.path)
    if gen.max_prompts is not None:
        rows = rows[: gen.max_prompts]
    if rows and gen.dataset.prompt_key not in rows[0] and not is_gsm8k_row(rows[0], gen.dataset.prompt_key):
        raise StepError(f"dataset {gen.dataset.path} has no column '{gen.dataset.prompt_key}' "
                        f"(columns: {', '.join(rows[0])}); set generate.dataset.prompt_key")
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or server_model(config, alloc.server.backend))
    prompts = [prompt_token_ids(rl_prompt(r, gen.dataset.prompt_key), tokenizer,
                                chat_template=gen.apply_chat_template) for r in rows]
    nr = name_resolve_for(config)
    servers = wait_for_servers(nr, alloc.server.dp, config.rollout.setup_timeout)
    print(f"rlkit generate: {len(rows)} prompts on {len(servers)} servers: "
          + ", ".join(f"{s.index}@{s.address}" for s in servers), flush=True)
    pool = ServerPool(servers, read_token(paths), timeout=config.rollout.request_timeout,
                      retries=config.rollout.request_retries, max_in_flight=config.rollout.max_concurrent_rollouts)
    output = paths.output(gen.output_file)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.partial")
    started = time.monotonic()
    with open(tmp, "w") as out:
        per_server = asyncio.run(_complete_all(pool, prompts, sampling_params(config), rows,
                                               gen.dataset.prompt_key, out))
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, output)
    nr.close()
    print(f"rlkit generate: wrote {len(rows)} prompts x {config.gconfig.n_samples} completions to {output} in "
          f"{time.monotonic() - started:.1f} s; prompts per server: {dict(sorted(per_server.items()))}", flush=True)
