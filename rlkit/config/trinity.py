"""Trinity-RFT's configs read by `rlkit migrate`: its keys moved to rlkit's, every key rlkit has no field for listed
with what became of it, the keys whose meaning rlkit has not built refused (exit 2) naming why.

A file is Trinity-RFT's when one of its top-level sections is Trinity-RFT's own (`synchronizer`, `explorer`, `buffer`,
`algorithm`: no rlkit or AReaL section has these names). The mapping written here then goes through AReaL's path
(rlkit.config.areal.migrate) like any rlkit file, so render's checks judge the result. Key names follow Trinity-RFT's
configuration guide (../shared/seeds/trinity-rft-config-guide.md); rlkit/cli/key_maps.py's TRINITY table documents
the same names (a unit test holds the two together). The file's `${...}` references are resolved first
(rlkit.config.trinity_refs: they name Trinity-RFT's keys); its KL functions, reward names and expert-data ratio are
judged in rlkit.config.trinity_terms; its embedded verl trainer config (trainer.trainer_config) in
rlkit.config.trinity_verl.
"""

from __future__ import annotations

import copy
import dataclasses
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlkit.config.areal.names import AREAL_KEYS
from rlkit.config.areal.rules import show
from rlkit.config.dotted import put
from rlkit.config.load import read_yaml
from rlkit.config.problems import Problems
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.config.trinity_advantage import advantage
from rlkit.config.trinity_knobs import defaults, eval_sampling, infra_reason, knobs
from rlkit.config.trinity_lora import lora_adapters
from rlkit.config.trinity_loss import ALGORITHM_NOT_BUILT, TYPE, policy_loss
from rlkit.config.trinity_offline import OFFLINE, is_offline, offline
from rlkit.config.trinity_refs import resolve_references
from rlkit.config.trinity_stages import has_stages, stages_to_rlkit
from rlkit.config.trinity_terms import TRINITY_DEFAULT_TYPE, entropy_term, expert_ratio, kl_terms, reward_fn
from rlkit.config.trinity_verl import embedded_verl
from rlkit.errors import ConfigError, ConfigErrors

TRINITY_SECTIONS = ("synchronizer", "explorer", "buffer", "algorithm")

_AUX = "buffer.trainer_input.auxiliary_buffers.sft_dataset"
_WARMUP = "buffer.trainer_input.sft_warmup_dataset"  # older Trinity-RFT releases' name of the expert data

# Trinity-RFT key -> rlkit key, the value unchanged
RENAMES: dict[str, str] = {
    "project": "experiment_name",
    "name": "trial_name",
    "checkpoint_root_dir": "cluster.fileroot",
    "algorithm.repeat_times": "gconfig.n_samples",
    "algorithm.optimizer.lr": "actor.optimizer.lr",
    "algorithm.optimizer.lr_scheduler_type": "actor.optimizer.lr_scheduler_type",
    "algorithm.optimizer.weight_decay": "actor.optimizer.weight_decay",
    "algorithm.optimizer.min_lr_ratio": "actor.optimizer.min_lr_ratio",
    "explorer.rollout_model.gpu_memory_utilization": "vllm.gpu_memory_utilization",
    "explorer.rollout_model.enforce_eager": "vllm.enforce_eager",
    "algorithm.advantage_fn_args.tau": "opmd.tau",
    "algorithm.policy_loss_fn_args.tau": "opmd.tau",
    "algorithm.advantage_fn_args.opmd_baseline": "opmd.opmd_baseline",
    "algorithm.policy_loss_fn_args.mu": "mix.mu",
    "algorithm.policy_loss_fn_args.loss_agg_mode": "actor.loss_agg_mode",  # verl's names, as rlkit's
    "algorithm.loss_agg_mode": "actor.loss_agg_mode",  # newer Trinity-RFT releases' place of it
    "model.model_path": "actor.path",
    "model.max_model_len": "vllm.max_model_len",
    "model.max_response_tokens": "gconfig.max_new_tokens",
    "model.min_response_tokens": "gconfig.min_new_tokens",
    "cluster.node_num": "cluster.n_nodes",
    "cluster.gpu_per_node": "cluster.n_gpus_per_node",
    "buffer.batch_size": "train_dataset.batch_size",
    "buffer.total_epochs": "total_train_epochs",
    "buffer.total_steps": "total_train_steps",
    "buffer.explorer_input.taskset.path": "train_dataset.path",
    "buffer.explorer_input.taskset.split": "train_dataset.split",
    "buffer.explorer_input.taskset.format.prompt_key": "train_dataset.prompt_key",
    "buffer.explorer_input.taskset.format.response_key": "reward.answer_key",  # the truth the reward checks against
    "buffer.explorer_input.taskset.rollout_args.temperature": "gconfig.temperature",
    f"{_AUX}.path": "expert_dataset.path",
    f"{_AUX}.format.prompt_key": "sft.prompt_key",
    f"{_AUX}.format.response_key": "sft.response_key",
    f"{_AUX}.format.tools_key": "sft.tools_key",  # None: '' (above)
    f"{_WARMUP}.path": "expert_dataset.path",
    "synchronizer.sync_interval": "actor.weight_update_interval",
    "synchronizer.sync_offset": "actor.weight_update_offset",
    "synchronizer.sync_timeout": "actor.weight_update_timeout",
    "explorer.eval_interval": "evaluator.freq_steps",
    "explorer.eval_on_startup": "evaluator.eval_on_startup",
    "trainer.total_steps": "total_train_steps",
    "trainer.save_interval": "saver.freq_steps",
    "trainer.max_checkpoints_to_keep": "recover.keep_last",
    "trainer.use_dynamic_bsz": "actor.mb_spec.packing",
    "trainer.grad_clip": "actor.optimizer.gradient_clipping",
    "trainer.max_token_len_per_gpu": "actor.mb_spec.max_tokens_per_mb",
    "trainer.ulysses_sequence_parallel_size": "actor.fsdp.ulysses_sp_size",
}

# algorithm_type -> what its job type adds, said in the header
_ALGORITHM_HOW = {"mix": " (the SFT loss of expert_dataset weighted by mix.mu)",
                  "cispo": " (GRPO's advantages; its policy loss: policy_loss_fn, cispo by default)",
                  "gspo": " (GRPO's advantages; its policy loss: policy_loss_fn, gspo by default)"}
SYNC_METHODS = {"nccl": "xccl", "checkpoint": "disk", "memory": "disk"}

# why a Trinity-RFT key is left out, for the keys whose reason is worth more than "no such key"
_WHY: dict[str, str] = {
    "algorithm.sample_strategy": "rlkit reads a step's samples in the order they were generated",
    "algorithm.advantage_fn": "set by the job type",
    "buffer.explorer_input.default_workflow_type": "rlkit's rollouts are single-turn unless rollout.agent is set",
    "buffer.explorer_input.taskset.default_workflow_type": "rlkit's rollouts are single-turn unless rollout.agent "
                                                           "is set",
    "buffer.explorer_input.eval_tasksets": "rlkit evaluates one set: give its path as valid_dataset.path",
    "buffer.trainer_input.experience_buffer": "rlkit's samples go from the servers to the trainer in memory",
    "synchronizer.sync_style": "fixed: a push every actor.weight_update_interval steps is what rlkit does",
    "mode": "both: rlkit runs the servers and the trainer in one job",
    "monitor.monitor_type": "each sink has its own section under stats_logger",
    "model.critic_model_path": "only algorithm_type ppo trains a critic",
}
# the explorer's engines, read into allocation_mode with the cluster (_allocation)
_ENGINES = tuple(f"explorer.rollout_model.{name}" for name in ("engine_type", "engine_num", "tensor_parallel_size"))
_NOT_BUILT = ("not built: rlkit pushes weights on the trainer's fixed schedule (actor.weight_update_interval, "
              "actor.weight_update_offset); the explorer and trainer cannot trigger a push")


@dataclass(frozen=True)
class TrinityKey:
    """One Trinity-RFT key of the file and what became of it (for the migrated file's header)."""

    key: str
    value: Any
    fate: str


def is_trinity(data: dict[str, Any]) -> bool:
    """Whether a file's mapping is Trinity-RFT's: one of its top-level sections is Trinity-RFT's own."""
    return any(section in data for section in TRINITY_SECTIONS)


def check_known(data: dict[str, Any], source: str) -> None:
    """Refuse a file that is neither rlkit's (or AReaL's) nor Trinity-RFT's: none of its top-level keys is known, so
    listing each as unknown would bury the point."""
    known = {f.name for f in dataclasses.fields(ExperimentConfig)} | set(AREAL_KEYS[""].split())
    if data and not is_trinity(data) and not known & set(data):
        raise ConfigError(f"{source} is neither an rlkit (AReaL) config nor a Trinity-RFT config: none of its "
                          f"top-level keys ({', '.join(sorted(map(str, data))[:8])}) is one of theirs",
                          hint="rlkit migrate reads AReaL, Trinity-RFT and verl configs (Trinity-RFT's have "
                               f"{', '.join(TRINITY_SECTIONS)} sections, verl's actor_rollout_ref or "
                               "algorithm.adv_estimator) and verl run scripts (python3 -m verl.trainer.main_ppo ...)")


def _leaves(data: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{path}.")
        else:
            yield path, value


def trinity_to_rlkit(data: dict[str, Any], source: str,
                     algorithms: Mapping[str, str]) -> tuple[dict[str, Any], list[TrinityKey]]:
    """The rlkit mapping of a Trinity-RFT file and the fate of each of its keys; ConfigErrors naming every key whose
    meaning rlkit has not built. `algorithms`: Trinity-RFT's algorithm_type -> rlkit's job type, from the job types'
    records (rlkit.jobs.REGISTRY.trinity_algorithms; config does not import the jobs)."""
    resolved, references = resolve_references(copy.deepcopy(data), source)
    leaves = dict(_leaves(resolved))
    problems = Problems()
    out: dict[str, Any] = {}
    fates: list[TrinityKey] = []

    def fate(key: str, value: Any, what: str) -> None:
        fates.append(TrinityKey(key, value, what + (f" (resolved from {references[key]})" if key in references
                                                    else "")))

    def moved(key: str, to: str, value: Any, how: str = "") -> None:
        put(out, to, value)
        fate(key, leaves[key], f"moved to {to}{how}")

    def left(key: str, why: str) -> None:
        fate(key, leaves[key], f"left out ({why})")

    expert_data = any(leaves.get(f"{section}.path") for section in (_AUX, _WARMUP))
    # a trainer-only run (mode train: sft, dpo) judges its buffer and the keys of servers first
    judged = offline(leaves, moved, left, lambda to, value: put(out, to, value), problems, source, fate)
    rest = {key: value for key, value in leaves.items() if key not in judged}
    # the embedded verl config first: its values win over some of the trainer section's (rlkit.config.trinity_verl)
    judged |= embedded_verl(rest, fate, lambda to, value: put(out, to, value), left, problems, source,
                            rl=not is_offline(leaves))
    rest = {key: value for key, value in leaves.items() if key not in judged}
    # the policy loss before the clip knobs: cispo's and gspo's bounds are their own (rlkit.config.trinity_loss)
    judged |= policy_loss(rest, moved, left, lambda to, value: put(out, to, value), fate, problems, source)
    rest = {key: value for key, value in leaves.items() if key not in judged}
    judged |= kl_terms(rest, moved, left, lambda to, value: put(out, to, value), fate, problems, source) \
        | reward_fn(rest, moved, left) | expert_ratio(rest, moved, left, problems, source, expert_data) \
        | entropy_term(rest, moved, left, problems, source) \
        | advantage(rest, moved, left, lambda to, value: put(out, to, value), fate, problems, source) \
        | lora_adapters(rest, moved, left, lambda to, value: put(out, to, value), problems, source) \
        | knobs(rest, moved, left, lambda to, value: put(out, to, value), problems, source)
    for key, value in leaves.items():
        if key in judged:
            continue
        if key == f"{_AUX}.format.tools_key" and expert_data and (value is None or isinstance(value, str)):
            # the expert rows go through sft's row reader (rlkit.jobs.grpo.expert), which reads sft.tools_key
            moved(key, "sft.tools_key", value or "", "" if value else " (None: no tools column read)")
        elif key in RENAMES and not expert_data and RENAMES[key].startswith(("mix.", "sft.")):
            # without expert rows the mix is off: its weight and row format would be refused as ignored
            # (rlkit.checks.conditional_knobs)
            left(key, "no expert data (auxiliary_buffers.sft_dataset.path): the SFT+RL mix is off")
        elif key in RENAMES:
            moved(key, RENAMES[key], value)
        elif key == "algorithm.algorithm_type":
            if not isinstance(value, str) or value not in algorithms:
                why = ALGORITHM_NOT_BUILT.get(str(value))
                problems.add(f"algorithm.algorithm_type '{value}' ({source}) has no rlkit job type"
                             + (f": {why}" if why else ""),
                             hint=f"rlkit has {', '.join(sorted(algorithms))}")
                continue
            moved(key, "type", algorithms[value], f" as {algorithms[value]}" + _ALGORITHM_HOW.get(value, ""))
        elif key == "synchronizer.sync_method":
            if not isinstance(value, str) or value not in SYNC_METHODS:
                problems.add(f"synchronizer.sync_method '{value}' ({source}) has no rlkit weight_update_mode",
                             hint="nccl becomes xccl, checkpoint or memory becomes disk")
                continue
            if _get(out, "actor.use_lora") and SYNC_METHODS[value] != "disk":
                moved(key, "actor.weight_update_mode", "disk", " as disk (LoRA: rlkit sends the adapter alone, a "
                                                               "small directory each server loads)")
            else:
                moved(key, "actor.weight_update_mode", SYNC_METHODS[value], f" as {SYNC_METHODS[value]}")
        elif key == "synchronizer.sync_style" and value not in (None, "fixed"):
            problems.add(f"synchronizer.sync_style '{value}' ({source}) is {_NOT_BUILT}",
                         hint="use sync_style: fixed (or leave it out)")
        elif key == "mode" and value == "train":
            problems.add(f"mode 'train' with algorithm_type '{leaves.get('algorithm.algorithm_type', 'ppo')}' "
                         f"({source}): rlkit trains {' and '.join(OFFLINE)} from a dataset alone; training an RL "
                         "algorithm from a stored experience buffer is not built",
                         hint="leave mode out (both: rlkit runs the servers and the trainer in one job), or use "
                              "algorithm_type sft or dpo")
        elif key == "mode" and value not in (None, "both"):
            problems.add(f"mode '{value}' ({source}): rlkit runs the servers and the trainer in one job (both)",
                         hint="a generation-only job is rlkit's job type generate; leave mode out")
        elif key == "continue_from_checkpoint":
            mode = "auto" if value else "disabled"
            moved(key, "recover.mode", mode, f" as {mode}")
        elif key == "model.critic_model_path" and leaves.get(TYPE, TRINITY_DEFAULT_TYPE) == "ppo":
            moved(key, "critic.path", value)
        elif key == "buffer.explorer_input.eval_tasksets" and isinstance(value, list) and len(value) == 1 \
                and isinstance(value[0], dict) and value[0].get("path"):
            sampling = eval_sampling(value[0])
            for name, setting in sampling.items():
                put(out, f"eval_gconfig.{name}", setting)
            moved(key, "valid_dataset.path", value[0]["path"], " (its path; rlkit evaluates one set; eval_gconfig "
                  + ", ".join(f"{name} {setting}" for name, setting in sampling.items()) + ")")
        elif key.startswith(_ENGINES):
            continue  # judged with the cluster below
        else:
            left(key, _WHY.get(key) or infra_reason(key) or "rlkit has no such key")
    if TYPE not in leaves and TRINITY_DEFAULT_TYPE in algorithms:  # the run is Trinity-RFT's default type's
        put(out, "type", algorithms[TRINITY_DEFAULT_TYPE])
        fates.append(TrinityKey(TYPE, "(unset)", f"moved to type as {algorithms[TRINITY_DEFAULT_TYPE]}, Trinity-RFT's "
                                                 "default algorithm_type (AlgorithmConfig)"))
    for key, to, value, how in defaults(rest, problems, source):
        if _get(out, to) is None:  # not set from another key of the file
            put(out, to, value)
            fates.append(TrinityKey(key, leaves.get(key, "(unset)"), f"moved to {to} as {value}{how}, "
                                                                     "Trinity-RFT's default"))
    if is_offline(leaves):  # the trainer takes every GPU, as configs/sft.yaml and dpo.yaml write it
        nodes, gpus = leaves.get("cluster.node_num", 1), leaves.get("cluster.gpu_per_node", 8)  # Trinity-RFT's
        if isinstance(nodes, int) and isinstance(gpus, int) and nodes * gpus > 0:
            put(out, "allocation_mode", f"fsdp:d{nodes * gpus}")
    else:
        _allocation(leaves, out, fates, problems, source)
    if leaves.get("algorithm.algorithm_type") == "mix" and not _get(out, "expert_dataset.path"):
        problems.add(f"algorithm_type mix ({source}) needs its expert data",
                     hint=f"set {_AUX}.path (rlkit's expert_dataset.path)")
    problems.raise_if_any()
    return out, fates


def _get(tree: dict[str, Any], key: str) -> Any:
    for part in key.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return None
        tree = tree[part]
    return tree


def _allocation(leaves: dict[str, Any], out: dict[str, Any], fates: list[TrinityKey], problems: Problems,
                source: str) -> None:
    """allocation_mode from the explorer's rollout engines and the cluster: Trinity-RFT's explorer takes
    engine_num x tensor_parallel_size GPUs, its trainer the rest."""
    prefix = "explorer.rollout_model."
    keys = [k for k in leaves if k.startswith(_ENGINES)]
    engine = leaves.get(f"{prefix}engine_type", "vllm")
    if engine not in ("vllm", "vllm_async"):
        problems.add(f"{prefix}engine_type '{engine}' ({source}): rlkit's Trinity-RFT reading knows vLLM engines",
                     hint="set allocation_mode yourself (vllm:... or sglang:...) and leave engine_type out")
        return
    n, t = leaves.get(f"{prefix}engine_num"), leaves.get(f"{prefix}tensor_parallel_size", 1)
    nodes, gpus = leaves.get("cluster.node_num"), leaves.get("cluster.gpu_per_node")
    sizes = [v for v in (n, t, nodes, gpus) if isinstance(v, int) and not isinstance(v, bool)]
    if len(sizes) == 4:  # numbers (references are resolved before)
        n, t, nodes, gpus = sizes
        trainer = nodes * gpus - n * t
        if trainer < 1:
            problems.add(f"explorer.rollout_model ({source}): {n} engines of {t} GPUs leave the trainer none of "
                         f"the cluster's {nodes * gpus}", hint="lower engine_num or raise cluster.node_num")
            return
        mode = f"vllm:d{n}" + (f"t{t}" if t != 1 else "") + f"+fsdp:d{trainer}"
        put(out, "allocation_mode", mode)
        fates.extend(TrinityKey(k, leaves[k], f"read into allocation_mode {mode}") for k in keys)
        return
    fates.extend(TrinityKey(k, leaves[k], "left out (set allocation_mode, e.g. vllm:d2t2+fsdp:d4)") for k in keys)


def header(path: Path, fates: list[TrinityKey]) -> str:
    """The header lines naming every Trinity-RFT key of the file and what became of it."""
    lines = [f"# Trinity-RFT config {path.name} read by `rlkit migrate`; its keys and what became of each:"]
    for item in sorted(fates, key=lambda f: f.key):
        value = show(item.value)
        value = value if len(value) <= 60 else value[:57] + "..."
        lines.append(f"#   {item.key}: {value}  -> {item.fate}")
    return "\n".join(line.replace("\n", " ") for line in lines) + "\n"


@contextmanager
def as_rlkit_file(path: Path, algorithms: Mapping[str, str]) -> Iterator[tuple[Path, str]]:
    """The file `rlkit migrate` reads for `path` and the header its output starts with: `path` itself and '' for an
    rlkit (AReaL) file; for a Trinity-RFT file, its rlkit mapping written to a file of the same name in a temporary
    directory (render's checks read a file) and the header of its Trinity-RFT keys. `algorithms`: as for
    trinity_to_rlkit."""
    data = read_yaml(path)
    check_known(data, f"'{path}'")
    if not is_trinity(data):
        yield path, ""
        return
    if has_stages(data):  # one rlkit stage per Trinity-RFT stage, each migrated as a file of its own
        def convert(stage: dict[str, Any], source: str) -> tuple[dict[str, Any], list[tuple[str, Any, str]]]:
            mapping, fates = trinity_to_rlkit(stage, source, algorithms)
            return mapping, [(f.key, f.value, f.fate) for f in fates]

        mapping, staged = stages_to_rlkit(data, f"in {path}", convert)
        fates = [TrinityKey(*fate) for fate in staged]
    else:
        mapping, fates = trinity_to_rlkit(data, f"in {path}", algorithms)
    with written(path, mapping, header(path, fates)) as converted:
        yield converted


@contextmanager
def written(path: Path, mapping: dict[str, Any], head: str) -> Iterator[tuple[Path, str]]:
    """Another system's file `path` as its rlkit `mapping`, written to a file of the same name in a temporary
    directory (render's checks read a file), with the header `head`; an error naming that file names `path`."""
    with tempfile.TemporaryDirectory(prefix="rlkit-migrate-") as tmp:
        converted = Path(tmp) / path.name
        converted.write_text(yaml.safe_dump(mapping, sort_keys=False))
        try:
            yield converted, head
        except ConfigError as exc:  # a message names the user's file, not the temporary one gone with this block
            raise _naming(exc, str(converted), str(path)) from None


def _naming(exc: ConfigError, temporary: str, user_file: str) -> ConfigError:
    """`exc` with `temporary` replaced by `user_file` in its message and hint (each error of a ConfigErrors)."""
    if isinstance(exc, ConfigErrors):
        return ConfigErrors([_naming(error, temporary, user_file) for error in exc.errors])
    return ConfigError(exc.message.replace(temporary, user_file),
                       hint=exc.hint.replace(temporary, user_file) if exc.hint else None, site=exc.site)
