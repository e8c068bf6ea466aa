"""Submit-time checks of the `reward` section wherever a job scores completions (grpo, ppo, opmd, distill; generate
with generate.score): every function resolves (a user's module is imported here, on the login node), a mix's names
and time limits are consistent, the reward model is one rw wrote. Job type generate also has its reward model fit
the GPU-less client step (rlkit.jobs.generate) and refuses reward.fn none (nothing to score)."""

from __future__ import annotations

from pathlib import Path

from rlkit.checks.reward_model import validate_reward_model
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.data.dataset_head import DatasetHead
from rlkit.data.row_field import MISSING, row_field, where_missing

ANSWER_REWARDS = ("math", "exact_match")  # the built-in rewards that read reward.answer_key from the row
ANSWER_ROWS = 16  # a nested answer key is looked up in this many first rows (a column's presence is the schema's)
# What a reward model's worker holds besides its weights: the Python process, torch, transformers, the tokenizer.
PROCESS_OVERHEAD_MB = 2048
_HALF_DTYPES = ("bfloat16", "float16")
_WEIGHT_SUFFIXES = (".safetensors", ".bin")


def scoring_functions(config: ExperimentConfig) -> list[str]:
    """The reward functions that score completions: reward.fns' specs, else reward.fn."""
    return [spec.strip() for spec in config.reward.fns] or [config.reward.fn.strip()]


def answer_readers(config: ExperimentConfig) -> list[str]:
    """The scoring functions that read reward.answer_key from the row (none when an agent workflow scores each
    episode by its trace: verifiers never calls reward.fn)."""
    if config.rollout.agent.workflow == "verifiers":
        return []
    return [fn for fn in scoring_functions(config) if fn in ANSWER_REWARDS]


def answer_gap(head: DatasetHead, key: str, rows: str) -> str | None:
    """What the rows (named `rows`, e.g. "the dataset rows") lack of reward.answer_key, as the end of "reward.fn
    math needs ...": None when the key is a column, or a path through nested fields (rlkit.data.row_field) that
    each of the first ANSWER_ROWS rows holds, not null."""
    if key in head.columns:
        return None
    columns = ", ".join(head.columns) or "none"
    top = key.split(".", 1)[0]
    if "." not in key or top not in head.columns:
        return f"the answer column '{key}', which {rows} do not have (columns: {columns})"
    for number, row in enumerate(head.rows(ANSWER_ROWS, [top]), 1):
        value = row_field(row, key)
        if value is MISSING or value is None:
            return f"the answer field '{key}', which row {number} of {rows} lacks ({where_missing(row, key)})"
    return None


def validate_reward(config: ExperimentConfig, problems: Problems) -> None:
    """Add every problem of the reward section's functions to `problems` (imports the user's reward module)."""
    from rlkit.rewards import resolve_reward_fn

    reward = config.reward
    for spec in reward.fns or [reward.fn]:  # reward.fns: a weighted mix (rlkit.rewards.mix), each checked alike
        with problems.check():
            resolve_reward_fn(spec, reward.answer_key, reward.reward_model_path)
    if reward.fns:
        _validate_reward_mix(config, problems)
    validate_reward_model(config, problems)


def _validate_reward_mix(config: ExperimentConfig, problems: Problems) -> None:
    """reward.fns' names are distinct and reward.timeouts names only its functions."""
    from rlkit.rewards.mix import term_names

    reward = config.reward
    with problems.check():
        term_names(reward)
    for spec in sorted(set(reward.timeouts) - set(reward.fns)):
        problems.add(f"reward.timeouts names '{spec}', which reward.fns does not list",
                     hint="key reward.timeouts by the same function specs as reward.fns")
    # the rewards are the only learning signal unless distillation teaches (rewards only logged at rl_coef 0) or
    # the overlong penalty tells completions apart
    only_signal = config.type != "distill" and not config.actor.overlong_reward_penalty
    if reward.fns and not any(reward.fns.values()) and only_signal:
        problems.add(f"every weight of reward.fns is 0 ({', '.join(reward.fns)}): every reward would be 0, so "
                     "there would be nothing to learn from", hint="give the scoring function a non-zero weight, e.g. "
                     f"reward.fns={{{next(iter(reward.fns))}: 1.0}}")
    for spec, seconds in reward.timeouts.items():
        if seconds <= 0:
            problems.add(f"reward.timeouts['{spec}'] is {seconds}: a call needs a positive time limit",
                         hint=f"e.g. {reward.timeout:g}")


def reward_model_mb(path: str) -> int | None:
    """The memory (MB) a reward model's worker needs on the CPU: its weights as float32 (load_value_model's dtype;
    half-precision files double) plus PROCESS_OVERHEAD_MB; None when the directory holds no weight file here."""
    from rlkit import untrusted_json

    model = Path(path)
    try:
        files = [p for p in model.iterdir() if p.suffix in _WEIGHT_SUFFIXES and p.is_file()]
        size = sum(p.stat().st_size for p in files)
        settings = untrusted_json.loads((model / "config.json").read_text()) if (model / "config.json").is_file() \
            else {}
    except (OSError, ValueError):
        return None
    if not files:
        return None
    dtype = settings.get("torch_dtype") or settings.get("dtype") if isinstance(settings, dict) else None
    factor = 2 if dtype in _HALF_DTYPES else 1
    return int(size * factor / 2**20) + PROCESS_OVERHEAD_MB


def validate_client_reward_model(config: ExperimentConfig, problems: Problems) -> None:
    """A reward model scoring on a GPU-less client step (generate) fits its memory: one worker loads it on the CPU
    (reward.num_workers does not apply to it), so its float32 weights and a process must fit launcher.client_mem."""
    from rlkit.rewards.model_reward import REWARD_MODEL

    if REWARD_MODEL not in scoring_functions(config) or not config.reward.reward_model_path:
        return
    need = reward_model_mb(config.reward.reward_model_path)
    have = config.launcher.client_mem
    if need is not None and need > have:
        problems.add(f"reward.fn {REWARD_MODEL}: the reward model in {config.reward.reward_model_path} needs about "
                     f"{need} MB on the client step's CPU (its weights as float32 plus {PROCESS_OVERHEAD_MB} MB for "
                     f"the process), more than launcher.client_mem {have} MB: the step would be killed for memory",
                     hint=f"set launcher.client_mem to at least {need}, or score with a smaller reward model")
