"""verl's GPUs as rlkit's allocation_mode: verl colocates rollout and training on every GPU of the run (nnodes x
n_gpus_per_node); rlkit runs servers and trainer on GPUs of their own. The split written: about half the GPUs to the
servers, in whole servers of the rollout's tensor-parallel size, the rest to the trainer (FSDP), so the run keeps its
GPU count; the header says so, and allocation_mode=... on the command line chooses another split. The reward model's
servers (rlkit.config.verl.reward_model) take their GPUs first: from the run's when verl colocates the model, else on
nodes added for its pool."""

from __future__ import annotations

from typing import Any

from rlkit.config.verl.mapping import RunMapping, is_count

ROLLOUT = "actor_rollout_ref.rollout"
ENGINES = ("vllm", "sglang")
DEFAULTS = {"trainer.nnodes": 1, "trainer.n_gpus_per_node": 8, f"{ROLLOUT}.tensor_model_parallel_size": 2}  # verl's
REWARD_POOL_FIX = ("give the reward model GPUs of its own (reward_model.enable_resource_pool=True with "
                   "reward_model.nnodes and reward_model.n_gpus_per_node), lower "
                   "reward_model.rollout.tensor_model_parallel_size, ")
VLLM_ONLY = (f"{ROLLOUT}.enforce_eager", f"{ROLLOUT}.max_num_seqs")


def split(total: int, tp: int) -> tuple[int, int] | None:
    """(servers, trainer GPUs) of `total` GPUs: about half to servers of `tp` GPUs each; None when no split leaves
    both a server and a trainer GPU."""
    servers = max(1, (total // 2) // tp)
    trainer = total - servers * tp
    return (servers, trainer) if trainer >= 1 else None


def allocation(m: RunMapping) -> None:
    """allocation_mode and the cluster's size from the run's GPUs and rollout engine; the engine's memory fraction to
    its own section."""
    leaves = m.leaves
    engine = leaves.get(f"{ROLLOUT}.name", "vllm")
    name_key = f"{ROLLOUT}.name"
    if engine not in ENGINES:
        m.refuse(name_key, "rlkit's servers are vLLM or SGLang", "use vllm or sglang", unless="allocation_mode")
        return
    sizes = {key: leaves.get(key, default) for key, default in DEFAULTS.items()}
    if not all(is_count(v) for v in sizes.values()):
        if "allocation_mode" not in m.overridden:
            _unknown_gpus(m, {key: value for key, value in sizes.items() if not is_count(value)})
        for key in [*DEFAULTS, name_key]:
            if key in leaves and key not in m.done:
                m.left(key, "not a count here: set allocation_mode, cluster.n_nodes and cluster.n_gpus_per_node")
        _engine_keys(m, str(engine))
        return
    nodes, gpus, tp = sizes.values()
    total = nodes * gpus
    taken, own = m.reward_gpus  # the reward model's servers (rlkit.config.verl.reward_model)
    parts = split(total - taken, tp)
    if parts is None:
        rm = f" after the reward model's server(s) took {taken}" if taken else ""
        m.refuse(f"{ROLLOUT}.tensor_model_parallel_size", f"rlkit runs servers and trainer on GPUs of their own, and "
                 f"a server of {tp} GPUs leaves the trainer none of the run's {total}{rm}",
                 "lower tensor_model_parallel_size, add GPUs, " + (REWARD_POOL_FIX if taken else "") +
                 "or pass allocation_mode=...", unless="allocation_mode")
        return
    servers, trainer = parts
    added = -(-own // gpus)  # nodes for the reward model's pool of its own
    mode = f"{engine}:d{servers}" + (f"t{tp}" if tp != 1 else "") + f"+fsdp:d{trainer}"
    _put_top(m, "allocation_mode", mode)
    split_said = (f"read into allocation_mode {mode}: verl runs rollout and training on all {total} GPUs in turn, "
                  f"rlkit runs {servers} server(s) of {tp} GPU(s) and a {trainer}-GPU trainer side by side"
                  + (f", the reward model's server(s) on the other {taken}" if taken else "")
                  + (f", the reward model's pool ({own} GPUs) on {added} node(s) added" if own else ""))
    for key, to in (("trainer.nnodes", "cluster.n_nodes"), ("trainer.n_gpus_per_node", "cluster.n_gpus_per_node")):
        more = added if key == "trainer.nnodes" else 0
        _put_cluster(m, to, sizes[key] + more)
        m.fate(key, f"moved to {to}" + ("" if key in leaves else f" as {sizes[key]}, verl's default")
               + (f" plus {more} node(s) for the reward model's pool" if more else ""))
    for key in (name_key, f"{ROLLOUT}.tensor_model_parallel_size"):
        m.fate(key, split_said + ("" if key in leaves else " (verl's default)"))
    _engine_keys(m, str(engine))


def _unknown_gpus(m: RunMapping, bad: dict[str, Any]) -> None:
    """The refusal of a run whose GPUs are no count here (verl's `trainer.nnodes=$NNODES` from the environment):
    allocation_mode cannot be made, and the user's override is the fix."""
    first, *others = bad
    why = ("the run's GPUs (trainer.nnodes x trainer.n_gpus_per_node, in servers of the rollout's "
           "tensor_model_parallel_size) are not a count here" +
           "".join(f"; nor is {key} {bad[key]!r}" for key in others) +
           (": a shell variable's value is known only where verl runs" if any("$" in str(v) for v in bad.values())
            else ""))
    m.refuse(first, why, "pass allocation_mode=... with cluster.n_nodes=... and cluster.n_gpus_per_node=... for the "
                         "GPUs the run has (e.g. allocation_mode=vllm:d4t2+fsdp:d8 for 2 nodes of 8 GPUs: servers "
                         "and trainer on GPUs of their own), or write the numbers into the script")


def _put_top(m: RunMapping, key: str, value: Any) -> None:
    m.out[key] = value


def _put_cluster(m: RunMapping, key: str, value: Any) -> None:
    m.out.setdefault("cluster", {})[key.split(".", 1)[1]] = value


def _engine_keys(m: RunMapping, engine: str) -> None:
    memory = f"{ROLLOUT}.gpu_memory_utilization"
    if memory in m.leaves:
        to = "sglang.mem_fraction_static" if engine == "sglang" else "vllm.gpu_memory_utilization"
        m.moved(memory, to, m.leaves[memory], " (of the servers' own GPUs now: the trainer's memory is elsewhere)")
    if engine == "sglang":
        for key in VLLM_ONLY:
            if key in m.leaves:
                m.left(key, "vLLM's option; the servers are SGLang")
