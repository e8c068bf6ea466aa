"""Submit-time check of a prompt dataset's tools column (train_dataset, valid_dataset, generate.dataset tools_key):
the first row's tools are readable and its prompt can carry them, so a job does not queue to fail on row 0. Whether
the chat template renders them is judged as the job reads the rows (rlkit.data.files.prompt_token_ids)."""

from __future__ import annotations

from rlkit.config.schema.experiment import DatasetConfig
from rlkit.data.chat_tools import episode_tools_refusal, row_tools
from rlkit.data.dataset_head import DatasetHead
from rlkit.data.files import no_place_for_tools
from rlkit.data.row_formats import GSM8K_COLUMNS, rl_prompt
from rlkit.errors import ConfigError


def check_prompt_tools(field: str, ds: DatasetConfig, head: DatasetHead, *, chat_template: bool,
                       template_switch: str = "", episodes: bool = False) -> None:
    """ConfigError naming `field` when the first row's tools column is malformed, its prompt has no place for tools
    (raw text, token ids), or it has tools and `episodes` (rollout.agent) would not offer them."""
    if not ds.tools_key or ds.tools_key not in head.columns:
        return
    row = head.first_row([ds.tools_key, ds.prompt_key, *GSM8K_COLUMNS])
    if row is None:
        return
    setting = f"{field}.tools_key"
    try:
        tools = row_tools(row, ds.tools_key, setting)
    except ValueError as exc:
        raise ConfigError(f"{field}.path: the first row's {exc}",
                          hint=f"fix the rows' tools, or set {setting}='' to read no tools column") from None
    if tools and episodes:
        raise ConfigError(f"{field}.path: the first row: {episode_tools_refusal(setting)}")
    try:
        prompt = rl_prompt(row, ds.prompt_key)
    except KeyError:
        return  # the prompt column's own check names it
    why = no_place_for_tools(prompt, chat_template=chat_template, setting=setting,
                             template_switch=template_switch) if tools else None
    if why:
        raise ConfigError(f"{field}.path: the first row: {why}")
