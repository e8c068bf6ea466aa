"""verl's reward model (reward_model.enable) as rlkit's served reward model, for `rlkit migrate`.

What verl does (HEAD, read in its code): with reward_model.enable the training reward is the model's score alone. The
reward loop (reward_model.use_reward_loop, the default: verl/experimental/reward_loop/reward_loop.py
RewardLoopWorker.compute_score) sends each conversation, re-rendered through the reward model's chat template, to vLLM
(or SGLang) servers of reward_model.rollout.tensor_model_parallel_size GPUs (reward_model.py RewardModelManager: one
per tensor_model_parallel_size GPUs of its pool, the run's own GPUs in turn with the actor unless
enable_resource_pool gives it nnodes x n_gpus_per_node of its own, main_ppo.py init_resource_pool_mgr), and
scores with custom_reward_function instead when that is set (the function may query the servers through
reward_router_address). The legacy worker (use_reward_loop false: fsdp_workers.py / megatron_workers.py
RewardModelWorker) runs the model as a one-label token classifier read at the last token, and its rm_scores replace
the rule-based reward manager's (verl/workers/reward_manager/abstract.py _extract_reward_from_rm_scores). verl adds
no rule-based score to the model's: rlkit's reward.fn reward_model is the same reward.

rlkit serves the model on GPUs of its own (reward.reward_model_engine_num servers of
reward.reward_model_tensor_parallel_size GPUs): colocated in verl, one server's GPUs are taken from the run's before
the rollout/trainer split (rlkit.config.verl.layout reads RunMapping.reward_gpus); with a pool of its own, its
servers fill that pool on nodes added to the run."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from rlkit.config.served_models import CONTEXT_FIELD, ENGINE_NUM_FIELD, REWARD_MODEL, TP_FIELD
from rlkit.config.verl.mapping import RunMapping, is_count, put

RM = "reward_model"
ENABLE, LOOP, POOL = f"{RM}.enable", f"{RM}.use_reward_loop", f"{RM}.enable_resource_pool"
PATH, SERVING, CUSTOM = f"{RM}.model.path", f"{RM}.rollout.", "custom_reward_function.path"
TP_KEY, PATH_FIELD = f"{SERVING}tensor_model_parallel_size", "reward.reward_model_path"
VERL_LOOP_TP = 2  # verl/trainer/config/reward_model/dp_reward_loop.yaml rollout.tensor_model_parallel_size
SAME_SCORES = "how verl runs the model's forward passes (batching, sharding, offload, kernels): the scores are the same"
# keys (or sections, ending in ".") of the reward model's execution, left out with why
LEFT: tuple[tuple[str, str], ...] = (
    (LOOP, "verl's reward loop (vLLM servers) or its legacy FSDP/Megatron worker: either scores with the same model, "
           "and rlkit's reward-model servers do so too"),
    (f"{RM}.model.input_tokenizer", "rlkit always renders the conversation (prompt and completion) with the reward "
                                    "model's own chat template, as verl does when this names the policy's tokenizer "
                                    "(its default)"),
    (f"{SERVING}prompt_length", "verl's reward-model servers read it only as a generation limit; their context is "
                                "rollout.max_model_len, else the model's max_position_embeddings, as rlkit's "
                                f"{CONTEXT_FIELD} unset"),
    (f"{SERVING}response_length", f"the same: a generation limit, not the servers' context ({CONTEXT_FIELD})"),
    (f"{SERVING}gpu_memory_utilization", "the share of memory verl's colocated servers take beside the actor; rlkit's "
                                         "reward-model servers have their GPUs to themselves"),
    (f"{SERVING}name", "rlkit serves the reward model with vLLM's pooling runner; the model's scores either way"),
    (f"{RM}.num_workers", "verl's processes that send the conversations to the servers; rlkit's reward_model scores "
                          "in one worker that sends each sequence to them (reward.num_workers is for reward "
                          "functions)"),
    (f"{RM}.max_length", "the legacy worker's cut of the re-rendered input; rlkit's servers read a sequence up to "
                         f"their context ({CONTEXT_FIELD}, the model's own unless set)"),
    (f"{RM}.strategy", SAME_SCORES), (f"{RM}.micro_batch_size", SAME_SCORES),
    (f"{RM}.micro_batch_size_per_gpu", SAME_SCORES), (f"{RM}.use_dynamic_bsz", SAME_SCORES),
    (f"{RM}.forward_max_token_len_per_gpu", SAME_SCORES), (f"{RM}.ulysses_sequence_parallel_size", SAME_SCORES),
    (f"{RM}.model.use_remove_padding", SAME_SCORES), (f"{RM}.model.use_fused_kernels", SAME_SCORES),
    (f"{RM}.model.use_shm", SAME_SCORES), (f"{RM}.model.fsdp_config.", SAME_SCORES), (f"{RM}.megatron.", SAME_SCORES),
    (f"{RM}.nccl_timeout", SAME_SCORES), (f"{RM}.load_weight", SAME_SCORES), (SERVING, SAME_SCORES),
    (f"{RM}.launch_reward_fn_async", "verl computes the rule-based reward in the background; rlkit's reward workers "
                                     "score as completions arrive"),
    (f"{RM}.profiler.", "verl's profiler"),
)


def _override_values(m: RunMapping) -> Mapping[str, str]:
    """The command line's overrides as {key: value} (rlkit.config.verl.migrate passes them so); {} otherwise."""
    return m.overridden if isinstance(m.overridden, Mapping) else {}


def _chosen_reward(m: RunMapping) -> bool | None:
    """None: the user's overrides leave the reward to the run; else whether their reward.fn / reward.fns calls
    reward_model."""
    names = [k for k in m.overridden if k in ("reward.fn", "reward.fns") or k.startswith("reward.fns.")]
    if not names:
        return None
    values = _override_values(m)
    for name in names:
        if name.startswith("reward.fns.") and name.split(".", 2)[2] == REWARD_MODEL:
            return True
        try:
            value = yaml.safe_load(str(values.get(name, "")))
        except yaml.YAMLError:
            continue
        if value == REWARD_MODEL or (isinstance(value, dict) and REWARD_MODEL in value):
            return True
    return False


def _count(text: Any, fallback: int) -> int:
    """An override's count, else `fallback`."""
    try:
        value = int(str(text))
    except ValueError:
        return fallback
    return value if value > 0 else fallback


def reward_model(m: RunMapping) -> None:
    """reward_model.* as reward.fn reward_model, its path and its servers; refused where rlkit's reward would not be
    verl's; the reward-model servers' GPUs left in m.reward_gpus for the split (rlkit.config.verl.layout)."""
    leaves = m.leaves
    keys = [k for k in leaves if k.startswith(f"{RM}.") and k not in m.done and k != f"{RM}.reward_manager"]
    on = leaves.get(ENABLE)
    if on in (None, False):
        for key in keys:
            m.left(key, f"{ENABLE} is false")
        return
    chosen = _chosen_reward(m)
    if on is not True or chosen is False:
        if on is not True:
            m.refuse(ENABLE, "not true or false", "set it True or False")
        for key in keys:
            m.left(key, "your reward.fn / reward.fns override scores the run without the reward model")
        return
    if chosen is None and leaves.get(CUSTOM):
        m.refuse(ENABLE, f"{CUSTOM} is set too: "
                 + ("in verl's legacy worker the model's score replaces that function's in training (it scores "
                    "validation only)" if leaves.get(LOOP) is False else
                    "verl's reward loop then scores with that function alone, which may query the reward model's "
                    "servers (reward_router_address); rlkit's reward functions cannot call them"),
                 "pass reward.fn=reward_model for the model's score alone, reward.fns='{reward_model: 1.0, "
                 "/path/file.py:fn: 1.0}' where the function adds a rule's score to the model's (rlkit's mix is a "
                 "weighted sum), or reward.fn=/path/file.py:fn where it scores without the model")
        m.done.update(keys)
        return
    if not _readable(m):
        m.done.update(keys)
        return
    if chosen is None:
        put(m.out, "reward.fn", REWARD_MODEL)
    m.fate(ENABLE, "converted to reward.fn reward_model: verl's reward is the model's score alone (no rule-based "
                   "score is added)" + ("" if chosen is None else "; your reward.fn / reward.fns override names it"))
    _path(m)
    _servers(m)
    legacy = leaves.get(LOOP) is False
    for key in [k for k in keys if k not in m.done]:
        if legacy and key.startswith(SERVING):
            m.left(key, f"{LOOP} is false: verl's legacy worker does not read it")
            continue
        if key == f"{SERVING}max_model_len":  # null: the model's own context
            m.left(key, f"null: the model's own context, as rlkit's {CONTEXT_FIELD} unset")
            continue
        why = next((why for name, why in LEFT if key == name or (name.endswith(".") and key.startswith(name))), None)
        if why is not None:
            m.left(key, why)


def _readable(m: RunMapping) -> bool:
    """Whether rlkit can score with the model as verl loads it; refused (with the fix) where it cannot."""
    leaves, legacy, ok = m.leaves, m.leaves.get(LOOP) is False, True
    if legacy and leaves.get(f"{RM}.megatron.use_dist_checkpointing") not in (None, False):
        m.refuse(f"{RM}.megatron.use_dist_checkpointing", "verl loads the reward model from a Megatron distributed "
                 "checkpoint, which rlkit cannot read", "convert it to a Hugging Face *ForSequenceClassification with "
                                                        f"one label and give its directory as {PATH}")
        ok = False
    if leaves.get(f"{RM}.model.external_lib") not in (None, "", "null"):
        m.refuse(f"{RM}.model.external_lib", "verl imports it to register the reward model's architecture; rlkit "
                 "loads a transformers *ForSequenceClassification only", "give a reward model of a transformers "
                                                                          "architecture and leave it out")
        ok = False
    if leaves.get(f"{RM}.model.trust_remote_code") not in (None, False):
        m.refuse(f"{RM}.model.trust_remote_code", "the reward model runs code of its own, which rlkit does not run",
                 "give a reward model of a transformers architecture and set it False")
        ok = False
    for key in [k for k in leaves if k.startswith(f"{RM}.model.override_config.")]:
        if legacy:
            m.refuse(key, "verl's legacy worker overrides the reward model's config.json with it", "write it into a "
                     "copy of the model directory's config.json and give that path")
            ok = False
        else:
            m.left(key, "verl's reward loop does not read it")
    return ok


def _path(m: RunMapping) -> None:
    """reward_model.model.path as reward.reward_model_path (verl's default model path is no one's)."""
    if PATH_FIELD in m.overridden:
        m.left(PATH, f"your {PATH_FIELD} override is used")
    elif isinstance(m.leaves.get(PATH), str) and m.leaves[PATH]:
        m.moved(PATH, PATH_FIELD, m.leaves[PATH], " (a Hugging Face *ForSequenceClassification with one label, as "
                                                  "verl reads it, or an rlkit rw model)")
    else:
        m.refuse(PATH, "the run names no reward model (verl's default path is an example's)",
                 f"set reward_model.model.path, or pass {PATH_FIELD}=...", unless=PATH_FIELD)


def _servers(m: RunMapping) -> None:
    """The reward model's servers: their count and size, and the GPUs they take (m.reward_gpus)."""
    leaves, legacy = m.leaves, m.leaves.get(LOOP) is False
    tp = 1 if legacy else leaves.get(TP_KEY, VERL_LOOP_TP)
    if not is_count(tp):
        m.refuse(TP_KEY, "not a count of GPUs", "give a number, e.g. 1", unless=TP_FIELD)
        return
    pool = leaves.get(POOL, False)
    resources = (f"{RM}.n_gpus_per_node", f"{RM}.nnodes")
    if pool is True:
        gpn, nodes = (leaves.get(key, 0) for key in resources)
        if not (is_count(gpn) and is_count(nodes)) or gpn * nodes < tp:
            m.refuse(POOL, f"its pool is {RM}.nnodes x n_gpus_per_node = {nodes!r} x {gpn!r} GPUs, not room for a "
                     f"server of {tp} GPU(s) (verl refuses a pool of none)", f"set {RM}.nnodes and "
                     f"{RM}.n_gpus_per_node to counts, or {POOL}=False", unless=ENGINE_NUM_FIELD)
            return
        servers, where = gpn * nodes // tp, f"its pool of {gpn * nodes} GPUs ({nodes} x {gpn}) of its own"
    elif pool in (False, None):
        servers, where = 1, "the run's GPUs, which verl shares with the actor (rlkit cannot: they are taken first)"
        for key in resources:
            if key in leaves:
                m.left(key, f"{POOL} is false: verl colocates the reward model with the actor")
    else:
        m.refuse(POOL, "not true or false", "set it True or False")
        return
    values = _override_values(m)
    put(m.out, ENGINE_NUM_FIELD, servers)
    put(m.out, TP_FIELD, tp)
    taken = _count(values.get(ENGINE_NUM_FIELD), servers) * _count(values.get(TP_FIELD), tp)
    m.reward_gpus = (0, taken) if pool is True else (taken, 0)
    said = (f"converted to {ENGINE_NUM_FIELD} {servers} server(s) of {TP_FIELD} {tp} GPU(s) on {where}"
            + ("; verl's legacy worker shards the model over its GPUs with FSDP, rlkit serves a whole copy on each "
               f"GPU (pass {TP_FIELD}=N for a model too large for one)" if legacy else ""))
    mine = [f"{name} {values[name]}" for name in (ENGINE_NUM_FIELD, TP_FIELD) if name in values]
    said += f"; your {' and '.join(mine)} override(s) win: {taken} GPU(s) taken" if mine else ""
    for key in (TP_KEY, POOL, *(resources if pool is True else ())):
        if key in leaves or key == POOL:
            m.fate(key, said if key in leaves else said + f" ({POOL} unset: false, verl's default)")
    context = leaves.get(f"{SERVING}max_model_len")
    if f"{SERVING}max_model_len" in leaves and context is not None and not legacy:
        if is_count(context):
            m.moved(f"{SERVING}max_model_len", CONTEXT_FIELD, context)
        else:
            m.refuse(f"{SERVING}max_model_len", "not a count of tokens", "give a number, or leave it out",
                     unless=CONTEXT_FIELD)
