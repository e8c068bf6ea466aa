"""In-job step of job type generate (run by `rlkit client`): complete every prompt of a dataset (a file, or
reasoning-gym's rows generated here) on the trial's servers, write a jsonl file, and with generate.score score every
completion and write the summary (rlkit.jobs.generate.scoring, rlkit.jobs.generate.summary)."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlkit.config.allocation import parse_allocation
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.data.row_formats import rl_prompt
from rlkit.errors import FatalStepError
from rlkit.jobs.generate.scoring import CompletionScorer
from rlkit.jobs.generate.summary import describe, summarize, write_summary
from rlkit.jobs.prompt_rows import prompt_rows, row_prompt_ids
from rlkit.nameresolve import name_resolve_for
from rlkit.rewards.failing import FailingRewards
from rlkit.servers.backend import SamplingParams, server_model
from rlkit.servers.pool import ServerPool, wait_for_servers
from rlkit.servers.sampling import sampling_params as request_sampling
from rlkit.tasks.reasoning_gym import TASK_KEY
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import read_token


def sampling_params(config: ExperimentConfig) -> SamplingParams:
    """gconfig's request settings (rlkit.servers.sampling: greedy decoding as the rollouts and the evaluator)."""
    return request_sampling(config)


async def _complete_all(pool: ServerPool, prompts: list[list[int]], params: SamplingParams,
                        rows: list[dict[str, Any]], prompt_key: str, out: Any,
                        scoring: tuple[CompletionScorer, list[str], Callable[[list[int]], str]] | None = None,
                        ) -> dict[int, int]:
    """Run all requests concurrently (bounded by the pool); score each prompt's completions when `scoring` (the
    scorer, each prompt's text, the decoder) is given; write one line per prompt as each finishes."""
    per_server: dict[int, int] = {}

    async def one(i: int) -> None:
        server, completions = await pool.complete(prompts[i], params)
        per_server[server.index] = per_server.get(server.index, 0) + 1
        lines = [{"text": c.text, "token_ids": c.token_ids, "logprobs": c.logprobs, "finish_reason": c.finish_reason}
                 for c in completions]
        record: dict[str, Any] = {"index": i, "prompt": rows[i][prompt_key], "prompt_token_ids": prompts[i],
                                  "server": server.index, "completions": lines}
        if isinstance(rows[i].get(TASK_KEY), str):
            record["task"] = rows[i][TASK_KEY]  # a reasoning-gym row's task: the summary's per-task means
        if scoring is not None:
            scorer, texts, decode = scoring
            fields = await scorer.score(texts[i], [decode(c.token_ids) for c in completions], rows[i])
            for line, scored in zip(lines, fields, strict=True):
                line.update(scored)
        out.write(json.dumps(record) + "\n")

    try:
        await asyncio.gather(*(one(i) for i in range(len(prompts))))
    finally:
        await pool.aclose()
    return per_server


def _rows(config: ExperimentConfig) -> list[dict[str, Any]]:
    """The dataset's rows, its prompt column checked: a file's, or reasoning-gym's generated here (valid_size rows from
    valid_seed: an evaluation reads the rows a training run on the same section held out)."""
    return prompt_rows(config, config.generate.dataset, field="generate.dataset", valid=True, log="rlkit generate:")


def run_generate(trial_dir: Path, config: ExperimentConfig) -> None:
    """Complete the configured dataset; the output file appears (atomically) only when every prompt is done, then
    (generate.score) the summary beside it."""
    from transformers import AutoTokenizer

    paths = TrialPaths(Path(trial_dir))
    alloc = parse_allocation(config.allocation_mode)
    assert alloc.server is not None
    gen = config.generate
    rows, prompt_key = _rows(config), gen.dataset.prompt_key
    if gen.max_prompts is not None:
        rows = rows[: gen.max_prompts]
    tokenizer = AutoTokenizer.from_pretrained(config.tokenizer_path or server_model(config, alloc.server.backend))
    raw = [rl_prompt(r, prompt_key) for r in rows]
    prompts = [row_prompt_ids(r, i, p, tokenizer, gen.dataset, field="generate.dataset",
                              chat_template=gen.apply_chat_template, template_switch="generate.apply_chat_template")
               for i, (r, p) in enumerate(zip(rows, raw, strict=True))]
    scorer = CompletionScorer(config) if gen.score else None
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
    scoring = None
    if scorer is not None:  # the prompt text and completion text training's rollouts hand the reward
        texts = [p if isinstance(p, str) else tokenizer.decode(ids) for p, ids in zip(raw, prompts, strict=True)]
        scoring = (scorer, texts, lambda ids: tokenizer.decode(ids, skip_special_tokens=True))
    try:
        with open(tmp, "w") as out:
            per_server = asyncio.run(_complete_all(pool, prompts, sampling_params(config), rows, prompt_key, out,
                                                   scoring))
            out.flush()
            os.fsync(out.fileno())
    finally:
        if scorer is not None:
            scorer.close()
    os.replace(tmp, output)
    nr.close()
    print(f"rlkit generate: wrote {len(rows)} prompts x {config.gconfig.n_samples} completions to {output} in "
          f"{time.monotonic() - started:.1f} s; prompts per server: {dict(sorted(per_server.items()))}", flush=True)
    if scorer is not None:
        _summarize(paths, output, config, scorer)


def _summarize(paths: TrialPaths, output: Path, config: ExperimentConfig, scorer: CompletionScorer) -> None:
    """summary.json from the output's own lines (and the scorer's call counts), and its figures in the log."""
    with open(output) as f:
        records = [json.loads(line) for line in f]
    counts = scorer.counts()
    summary = summarize(records, n_samples=config.gconfig.n_samples, threshold=config.generate.pass_threshold,
                        counts=counts)
    write_summary(paths.summary, summary)
    for line in describe(summary):
        print(f"rlkit generate: {line}", flush=True)
    failed = counts["failed_calls"] + counts["timed_out_calls"]
    if failed:
        print(f"rlkit generate: WARNING: {failed} of {counts['reward_calls']} reward calls failed or timed out, each "
              "scored 0.0 (its line has reward_error); the first errors are above", flush=True)
    print(f"rlkit generate: wrote the summary to {paths.summary}", flush=True)
    failed_throughout = FailingRewards(scorer.scorer, config).failed_throughout()
    if failed_throughout:  # the summary's scores would be read as the model's: the job fails, naming the fix
        raise FatalStepError(f"{failed_throughout}. The completions are kept in {output} and the counts in "
                             f"{paths.summary}; their rewards are not the model's")
