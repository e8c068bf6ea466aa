"""Trinity-RFT's offline runs (`mode: train` with algorithm_type sft or dpo) as rlkit's trainer-only job types sft and
dpo, for `rlkit migrate` (rlkit.config.trinity).

In `mode: train` Trinity-RFT starts its trainer alone, reading `buffer.trainer_input.experience_buffer` (a dataset on
disk) through its SFT or DPO formatter (trinity/buffer/schema/formatter.py). That buffer is rlkit's train_dataset and
its `format` keys are the sft / dpo sections' row format. No servers run, so the explorer's, the synchronizer's, the
taskset's and the generation keys mean nothing: each is named as left out, saying why. Trinity-RFT's FormatConfig
defaults (prompt_type messages, messages_key "message") are written where the file leaves them: rlkit's differ.
`mode: train` with an RL algorithm (training from an experience buffer an earlier explore run stored) is not built.
"""

from __future__ import annotations

from typing import Any

from rlkit.config.problems import Problems
from rlkit.config.trinity_loss import Fate
from rlkit.config.trinity_terms import TRINITY_KL_COEF, Left, Moved, Put

OFFLINE = ("sft", "dpo")  # Trinity-RFT algorithm types rlkit runs from a dataset, trainer only
BUFFER = "buffer.trainer_input.experience_buffer."
FORMAT = f"{BUFFER}format."
# the keys of a run with servers: nothing reads them when only the trainer runs
_NO_SERVERS = ("explorer.", "synchronizer.", "buffer.explorer_input.", "model.max_response_tokens",
               "model.min_response_tokens", "model.max_prompt_tokens", "model.enable_prompt_truncation",
               "model.max_model_len", "model.temperature", "model.top_p", "model.top_k", "model.repetition_penalty",
               "model.enable_thinking", "algorithm.repeat_times", "algorithm.advantage_fn",
               "algorithm.sample_strategy")
_AUXILIARY = ("buffer.trainer_input.auxiliary_buffers.", "buffer.trainer_input.sft_warmup_")
_NO_SERVERS_WHY = "mode train: rlkit's {} job runs the trainer alone, no servers or rollouts"
# the buffer's keys that only a queue or a database reads
_STORE_ONLY = ("name", "max_read_timeout", "capacity", "use_priority_queue", "reuse_cooldown_time",
               "replay_buffer", "max_retry_times", "max_retry_interval", "enable_progress_bar", "index")
# Trinity-RFT's format key -> rlkit's sft key, the value unchanged
_SFT_FORMAT = {name: f"sft.{name}" for name in ("prompt_key", "response_key", "system_prompt_key", "system_prompt",
                                                 "messages_key", "enable_concatenated_multi_turn", "chat_template")}
_TERMS = ("algorithm.kl_loss_fn", "algorithm.kl_penalty_fn", "algorithm.entropy_loss_fn")


def is_offline(leaves: dict[str, Any]) -> bool:
    """Whether the file is a trainer-only run rlkit has a job type for: mode train with algorithm_type sft or dpo."""
    return leaves.get("mode") == "train" and leaves.get("algorithm.algorithm_type") in OFFLINE


def offline(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems,
            source: str, fate: Fate) -> set[str]:
    """Judge the keys of a trainer-only run: the experience buffer, its format, the batch and the terms of an RL
    loss; name the keys of servers as left out. Returns the keys judged here (none unless is_offline)."""
    if not is_offline(leaves):
        return set()
    kind = leaves["algorithm.algorithm_type"]
    judged = {"mode"}
    left("mode", f"train: rlkit's {kind} job type runs the trainer alone")
    for key in leaves:
        if key.startswith(_NO_SERVERS):
            judged.add(key)
            left(key, _NO_SERVERS_WHY.format(kind))
    for key in leaves:
        if key.startswith(_AUXILIARY):
            judged.add(key)
            left(key, f"only algorithm_type mix reads it: rlkit's {kind} reads train_dataset alone")
    judged |= _buffer(leaves, moved, left, put, problems, source, kind)
    judged |= _format(leaves, moved, left, put, problems, source, kind)
    judged |= _loss(leaves, moved, left, problems, source, kind, fate)
    return judged


def _buffer(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems, source: str,
            kind: str) -> set[str]:
    """The buffer's path, split and storage; the rows per step (train_batch_size, Trinity-RFT's in mode train)."""
    judged = {k for k in leaves if k.startswith(BUFFER) and not k.startswith(FORMAT)}
    judged |= {k for k in ("buffer.train_batch_size", "buffer.batch_size") if k in leaves}
    path = leaves.get(f"{BUFFER}path")
    if not path:
        problems.add(f"{BUFFER}path ({source}): mode train reads its rows from the experience buffer",
                     hint="set it to the dataset's file or directory (rlkit's train_dataset.path)")
    else:
        moved(f"{BUFFER}path", "train_dataset.path", path, "")
    if kind == "sft":
        put("train_dataset.type", "sft")
    storage = leaves.get(f"{BUFFER}storage_type", "file")
    if storage != "file":
        problems.add(f"{BUFFER}storage_type {storage!r} ({source}): rlkit's {kind} reads a dataset's files",
                     hint="export the rows to jsonl or parquet and use storage_type file")
    elif f"{BUFFER}storage_type" in leaves:
        left(f"{BUFFER}storage_type", "file: rlkit reads files")
    if f"{BUFFER}split" in leaves:
        moved(f"{BUFFER}split", "train_dataset.split", leaves[f"{BUFFER}split"], "")
    if leaves.get(f"{BUFFER}subset_name") is not None:
        problems.add(f"{BUFFER}subset_name ({source}): rlkit reads a dataset's files (train_dataset.path), not a "
                     "hub subset", hint=f"point {BUFFER}path at the subset's files")
    for key in sorted(k for k in judged if k.startswith(BUFFER)):
        name = key[len(BUFFER):].split(".")[0]
        if name in (*_STORE_ONLY, "subset_name") and not (name == "subset_name" and leaves[key] is not None):
            left(key, "a setting of Trinity-RFT's buffer actors and queues: rlkit reads the file")
        elif name not in ("path", "storage_type", "split", "subset_name"):
            left(key, f"not read in mode train (rlkit's {kind} reads the rows of train_dataset.path)")
    put("train_dataset.shuffle", False)  # Trinity-RFT's file reader reads the rows in order
    size = leaves.get("buffer.train_batch_size")
    if size:
        moved("buffer.train_batch_size", "train_dataset.batch_size", size,
              " (rows per step" + (", each a pair)" if kind == "dpo" else ")"))
        if "buffer.batch_size" in leaves:
            left("buffer.batch_size", "train_batch_size, the trainer's, is read")
    elif kind == "sft" and leaves.get("buffer.batch_size"):
        moved("buffer.batch_size", "train_dataset.batch_size", leaves["buffer.batch_size"],
              " (train_batch_size unset: batch_size x repeat_times, 1 for sft, as older Trinity-RFT releases read)")
    else:
        problems.add(f"buffer.train_batch_size ({source}): Trinity-RFT requires it in mode train (the rows per "
                     "step)", hint=f"set it (rlkit's train_dataset.batch_size{': pairs' if kind == 'dpo' else ''})")
    return judged


def _format(leaves: dict[str, Any], moved: Moved, left: Left, put: Put, problems: Problems, source: str,
            kind: str) -> set[str]:
    """The format keys: sft's as the sft section; dpo's prompt column as train_dataset.prompt_key."""
    judged = {k for k in leaves if k.startswith(FORMAT) or k == "model.custom_chat_template"}
    if leaves.get("model.custom_chat_template", "") is None:
        left("model.custom_chat_template", "None: Trinity-RFT's default, nothing to carry")
    prompt_type = leaves.get(f"{FORMAT}prompt_type", "messages")  # FormatConfig's default
    messages_key = leaves.get(f"{FORMAT}messages_key", "message")
    if prompt_type not in ("plaintext", "messages"):
        problems.add(f"{FORMAT}prompt_type {prompt_type!r} ({source}): rlkit reads plaintext or messages rows",
                     hint="plaintext or messages")
        return judged
    plain = ("prompt_key", "response_key", "system_prompt_key", "system_prompt")
    for key in sorted(judged - {f"{FORMAT}prompt_type", "model.custom_chat_template"}):
        name, value = key[len(FORMAT):], leaves[key]
        if (name in plain and prompt_type == "messages") or (name == "messages_key" and prompt_type == "plaintext"):
            left(key, f"prompt_type {prompt_type}: Trinity-RFT does not read it")
        elif name in ("workflow_key", "reward_fn_key"):
            left(key, "a task's workflow or reward: no rollouts in mode train")
        elif name in ("chosen_key", "rejected_key") and kind == "sft":
            left(key, "a DPO column: sft does not read it")
        elif name == "enable_concatenated_multi_turn" and kind == "dpo":
            left(key, "Trinity-RFT reads it for sft only")
        elif name in ("chosen_key", "rejected_key"):
            moved(key, f"dpo.{name}", value, "")
        elif kind == "sft" and name in _SFT_FORMAT and not (name == "chat_template" and value is None):
            moved(key, _SFT_FORMAT[name], value, "")
        elif name == "tools_key" and kind == "dpo":
            left(key, "Trinity-RFT's dpo reads no tools")
        elif name == "tools_key":  # None: Trinity-RFT's sample.get(None) finds no column, so no tools
            moved(key, "sft.tools_key", value or "", "" if value else " (None: no tools column read)")
        elif value is None:
            left(key, "None: Trinity-RFT's default, nothing to carry")
        elif kind == "dpo" and name in ("prompt_key", "messages_key"):
            continue  # the prompt column, below
        else:
            problems.add(f"{key} ({source}): rlkit's {kind} has no such setting", hint="remove it" + (
                "; rlkit's dpo renders chats with the tokenizer's own template" if name == "chat_template" else ""))
    if kind == "sft":
        put("sft.prompt_type", prompt_type)
        if prompt_type == "messages" and f"{FORMAT}messages_key" not in leaves:
            put("sft.messages_key", messages_key)
        if f"{FORMAT}prompt_type" in leaves:
            moved(f"{FORMAT}prompt_type", "sft.prompt_type", prompt_type, "")
        _chat_template(leaves, moved, left, problems, source)
        return judged
    if prompt_type == "plaintext":
        problems.add(f"{FORMAT}prompt_type plaintext ({source}): Trinity-RFT sends a text pair through the chat "
                     "template (a user message, then an assistant message); rlkit's dpo reads text as it stands",
                     hint="write the rows as messages (the prompt a list of messages, chosen and rejected each "
                          "[{role: assistant, content: ...}]) and use prompt_type messages")
        return judged
    put("train_dataset.prompt_key", messages_key)
    fate = f"{FORMAT}messages_key" if f"{FORMAT}messages_key" in leaves else f"{FORMAT}prompt_type"
    if fate in leaves:
        moved(fate, "train_dataset.prompt_key", messages_key, " (the prompt's messages column)")
    if fate != f"{FORMAT}prompt_type" and f"{FORMAT}prompt_type" in leaves:
        left(f"{FORMAT}prompt_type", "messages: rlkit's prompt column holds the chat")
    if "model.custom_chat_template" in leaves and leaves["model.custom_chat_template"] is not None:
        problems.add(f"model.custom_chat_template ({source}): rlkit's dpo renders chats with the tokenizer's own "
                     "template", hint="put it in a copy of the model's tokenizer_config.json (chat_template)")
    return judged


def _chat_template(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str) -> None:
    """model.custom_chat_template: the sft rows' template when the format sets none (Trinity-RFT's fallback)."""
    key = "model.custom_chat_template"
    if leaves.get(key) is None:
        return
    if leaves.get(f"{FORMAT}chat_template") is not None:
        left(key, "the experience buffer's format.chat_template wins, as in Trinity-RFT")
    else:
        moved(key, "sft.chat_template", leaves[key], "")


def _loss(leaves: dict[str, Any], moved: Moved, left: Left, problems: Problems, source: str,
          kind: str, fate: Fate) -> set[str]:
    """The policy loss (Trinity-RFT's sft or dpo; dpo's beta and label_smoothing) and the KL and entropy terms,
    which Trinity-RFT's sft and dpo leave off (none) and rlkit's have not."""
    judged = {k for k in leaves if k.startswith(("algorithm.policy_loss_fn", "algorithm.loss_agg_mode",
                                                 *_TERMS))}
    if kind == "dpo":
        judged |= _dpo_kl(leaves, fate, problems, source)
    for key in sorted(judged - {"algorithm.kl_loss_fn"} if kind == "dpo" else judged):
        if kind == "dpo" and key.startswith("algorithm.kl_loss_fn_args"):
            continue  # judged by _dpo_kl
        value, name = leaves[key], key.rsplit(".", 1)[1]
        if key == "algorithm.policy_loss_fn":
            if value in (None, kind):
                left(key, f"{value!r}: the {kind} job type's loss")
            else:
                problems.add(f"{key} {value!r} ({source}): rlkit's {kind} job has its own loss",
                             hint=f"remove it (Trinity-RFT's {kind})")
        elif kind == "dpo" and key.startswith("algorithm.policy_loss_fn_args.") and name in ("beta",
                                                                                              "label_smoothing"):
            moved(key, f"dpo.{name}", value, "")
        elif key in _TERMS or key.startswith(tuple(f"{t}_args" for t in _TERMS)):
            if key in _TERMS and value in (None, "none"):
                left(key, "none: Trinity-RFT's default for sft and dpo")
            elif key in _TERMS:
                problems.add(f"{key} {value!r} ({source}): rlkit's {kind} adds no KL or entropy term",
                             hint="remove it (none, Trinity-RFT's default for sft and dpo)")
            else:
                left(key, f"arguments of a term rlkit's {kind} does not add")
        elif name == "loss_agg_mode" and value in (None, "token-mean"):
            left(key, "token-mean: rlkit's sft averages over the target tokens" if kind == "sft"
                 else "dpo's loss is per pair")
        else:
            problems.add(f"{key} {value!r} ({source}): rlkit's {kind} loss has no such setting",
                         hint="remove it")
    return judged


_DPO_KL = "algorithm.kl_loss_fn"


def _dpo_kl(leaves: dict[str, Any], fate: Fate, problems: Problems, source: str) -> set[str]:
    """Trinity-RFT adds a KL loss to every dpo run: DPOAlgorithm.check_config turns kl_loss_fn none (or unset) into
    k2, at kl_coef 0.001 unless its args say otherwise. rlkit's dpo has no KL term. At the default coefficient the
    term is 0.001 x (log p - log p_ref)^2 / 2 beside a loss that already anchors the policy to the reference
    through beta: the migration goes on, saying what the run lacks; any other KL function or coefficient is a
    choice the file made and is refused."""
    args = f"{_DPO_KL}_args."
    keys = {k for k in leaves if k == _DPO_KL or k.startswith(args)}
    fn = leaves.get(_DPO_KL)
    coef = leaves.get(f"{args}kl_coef", TRINITY_KL_COEF)
    if fn not in (None, "none", "k2"):
        problems.add(f"{_DPO_KL} {fn!r} ({source}): rlkit's dpo adds no KL term",
                     hint="remove it: Trinity-RFT's dpo then adds k2 at kl_coef 0.001, which the migration names")
        return keys
    if coef != TRINITY_KL_COEF or any(k not in (_DPO_KL, f"{args}kl_coef") for k in keys):
        problems.add(f"{args}kl_coef {coef!r} ({source}): rlkit's dpo adds no KL term, and this is not Trinity-RFT's "
                     f"default {TRINITY_KL_COEF}", hint="remove the kl_loss_fn_args, or train the KL term elsewhere")
        return keys
    why = (f"Trinity-RFT adds k2 at kl_coef {TRINITY_KL_COEF} to every dpo run (DPOAlgorithm.check_config, even for "
           "none); rlkit's dpo has no KL term, so the migrated run lacks 0.001 x (log p - log p_ref)^2 / 2 beside "
           "DPO's loss, which already anchors the policy to the reference through beta")
    for key in sorted(keys) or [_DPO_KL]:
        fate(key, leaves.get(key, "(unset)"), f"left out ({why})")
    return keys
