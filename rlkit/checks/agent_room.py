"""At submit: an agent run whose episodes could not even start is refused before it waits in the queue.

An episode's first prompt is the row's prompt with the tools offered, through the model's chat template; it must
leave room for a turn within the episode's token limit (rollout.agent.engine_max_tokens, else the servers' context).
The rollout drops the prompts that do not (rlkit.rollout.groups.EpisodeGroups.fitting) and stops the run when none
does; this check does the same on the login node over the first rows of the training set, so a config such as an
agent example run with the servers' default context of 128 tokens fails at submit with the fix, not after the job
started. It reads the model's own tokenizer with transformers' fast tokenizer class (the Rust tokenizer and the chat
template; no torch, ~2.5 CPU-s, only for agent configs) and is skipped where it cannot judge: a model or dataset that
is not a local file, Parquet rows without pyarrow here, a tokenizer without tokenizer.json, the openai and verifiers
workflows (the agent program or the environment writes its prompts).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlkit.config.model_config import is_local_path
from rlkit.config.problems import Problems
from rlkit.config.schema.agent import OPENAI_WORKFLOW, VERIFIERS_WORKFLOW
from rlkit.config.schema.experiment import ExperimentConfig, agent_limits
from rlkit.data.dataset_head import dataset_head
from rlkit.data.row_formats import GSM8K_COLUMNS
from rlkit.errors import ConfigError

ROWS_CHECKED = 64  # the first rows of the training set: their shortest first prompt must leave room for a turn


def _tokenizer(model: str) -> Any:
    if not is_local_path(model) or not (Path(model) / "tokenizer.json").is_file():
        return None
    try:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(model)
    except Exception:  # an unreadable tokenizer is the site checks' to report, or the job's
        return None


def validate_turn_room(config: ExperimentConfig, schemas: list[dict[str, Any]], problems: Problems,
                       context: int | None) -> None:
    """Refuse when not one of the first ROWS_CHECKED training prompts, rendered as the rollout renders an episode's
    first prompt with `schemas` (the tools offered), leaves room for a turn."""
    from rlkit.agent.chat import episode_chat, render_prompt, template_takes_tools

    agent, dataset = config.rollout.agent, config.train_dataset
    if agent.workflow.strip() in (OPENAI_WORKFLOW, VERIFIERS_WORKFLOW):
        return
    try:
        head = dataset_head("train_dataset.path", Path(dataset.path))
        rows = [row for row in (head.rows(ROWS_CHECKED, [dataset.prompt_key, *GSM8K_COLUMNS]) if head else [])
                if isinstance(row, dict)]
    except ConfigError:
        return  # the dataset checks say what is wrong with the file
    tokenizer = _tokenizer(config.tokenizer_path or config.actor.path) if rows else None
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        return
    limit = agent_limits(config, context)[1]
    takes_tools = template_takes_tools(tokenizer) if schemas else False
    shortest: int | None = None
    for row in rows:
        messages = episode_chat(row, dataset.prompt_key)
        if messages is None:
            return  # the column checks name a missing prompt column
        try:
            text = render_prompt(tokenizer, messages, schemas, takes_tools=takes_tools)
        except Exception:
            return  # a template that fails here fails in the job with its own message
        length = len(tokenizer.encode(text, add_special_tokens=False))
        shortest = length if shortest is None else min(shortest, length)
    if shortest is not None and shortest >= limit:
        setting = ("rollout.agent.engine_max_tokens" if agent.engine_max_tokens else
                   "the servers' context: vllm.max_model_len or sglang.context_length")
        problems.add(f"no episode could start: the shortest of the first {len(rows)} {dataset.path} prompts is "
                     f"{shortest} tokens once the chat template and the tools' text are added, and an episode may hold "
                     f"{limit} ({setting}), leaving no room for a turn",
                     hint=f"raise vllm.max_model_len (or sglang.context_length) or rollout.agent.engine_max_tokens "
                          f"above {shortest + 1}, or shorten the prompts")
