"""The groups of inference servers a trial runs beside the policy's: the user's `auxiliary_models`, and the reward
model's when `reward.reward_model_engine_num` > 0 (completions scored by a vLLM pooling server instead of trainer
rank 0's CPU). One list for every place that plans, starts, finds, waits for or reports such servers, so the reward
model's servers are planned, guarded, health-checked, restarted and shown exactly as an auxiliary model's.

The reward model's entry is derived from the config each time, never stored in `auxiliary_models`: a multi-stage run
hands an earlier rw stage's final to `reward.reward_model_path` (rlkit.launch.stage_reward), and the servers follow
it. Its name, `reward_model`, is the reward function's (reward.fn) and is reserved: no auxiliary model may take it
while the reward model is served. Torch-free.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.config.schema.auxiliary import AuxiliaryModelConfig, entry_field

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig, RewardConfig

REWARD_MODEL = "reward_model"  # the reward.fn name of the built-in reward model, and its servers' auxiliary name
REWARD_SERVERS_BACKEND = "vllm"  # vLLM's pooling runner serves rw's token-classification model (checked: 0.32)
ENGINE_NUM_FIELD = "reward.reward_model_engine_num"
TP_FIELD = "reward.reward_model_tensor_parallel_size"
CONTEXT_FIELD = "reward.reward_model_max_model_len"


def scores_with_reward_model(reward: RewardConfig) -> bool:
    """Whether the reward (reward.fns when set, else reward.fn) calls the built-in `reward_model`."""
    if reward.fns:
        return any(spec.strip() == REWARD_MODEL for spec in reward.fns)
    return reward.fn.strip() == REWARD_MODEL


def serves_reward_model(config: ExperimentConfig) -> bool:
    """Whether the reward model is scored by servers of its own (else on trainer rank 0's CPU)."""
    return config.reward.reward_model_engine_num > 0 and scores_with_reward_model(config.reward)


def reward_model_servers(config: ExperimentConfig) -> AuxiliaryModelConfig:
    """The reward model's servers as an auxiliary model entry (whether or not the config serves it)."""
    reward = config.reward
    return AuxiliaryModelConfig(name=REWARD_MODEL, model_path=reward.reward_model_path,
                                engine_num=reward.reward_model_engine_num,
                                tensor_parallel_size=reward.reward_model_tensor_parallel_size,
                                backend=REWARD_SERVERS_BACKEND, max_model_len=reward.reward_model_max_model_len)


def served_auxiliary_models(config: ExperimentConfig) -> list[AuxiliaryModelConfig]:
    """Every auxiliary group of servers of the trial: the user's entries, then the reward model's when served."""
    entries = list(config.auxiliary_models)
    if serves_reward_model(config):
        entries.append(reward_model_servers(config))
    return entries


def is_reward_servers(config: ExperimentConfig, name: str) -> bool:
    """Whether auxiliary name `name` is the served reward model (not a user's entry)."""
    return name == REWARD_MODEL and serves_reward_model(config)


def auxiliary_field(config: ExperimentConfig, name: str, key: str) -> str:
    """The config key that sets `key` (engine_num, tensor_parallel_size, max_model_len) of auxiliary group `name`,
    for messages: `auxiliary_models[i].<key>`, or the reward section's field for the reward model's servers."""
    if is_reward_servers(config, name):
        return {"engine_num": ENGINE_NUM_FIELD, "tensor_parallel_size": TP_FIELD,
                "max_model_len": CONTEXT_FIELD}.get(key, f"reward.reward_model_{key}")
    index = next((i for i, e in enumerate(config.auxiliary_models) if e.name == name), 0)
    return entry_field(index, key)
