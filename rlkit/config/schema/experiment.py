"""The experiment schema: dataclasses read by OmegaConf. Importable without torch or vLLM (login nodes stay fast).

Field names follow AReaL, which most of our users come from. Every field has a one-line `help` (its documentation
in the source; no command prints it yet). The actor section lives in rlkit.config.schema.actor; job types add theirs in
modules of their own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from omegaconf import MISSING

from rlkit.config.schema.actor import ActorConfig
from rlkit.config.schema.agent import DEFAULT_MAX_TOTAL_TOKENS, AgentConfig
from rlkit.config.schema.auxiliary import AuxiliaryModelConfig
from rlkit.config.schema.critic import CriticConfig
from rlkit.config.schema.distill import DistillConfig
from rlkit.config.schema.evaluation import EvalGenerationConfig, EvaluatorConfig
from rlkit.config.schema.fields import SEED_MAX, _f, _sub
from rlkit.config.schema.pairs import DPOConfig, RWConfig
from rlkit.config.schema.reasoning_gym import ReasoningGymConfig
from rlkit.config.schema.ref import RefConfig
from rlkit.config.schema.rl_mix import MixConfig, OPMDConfig
from rlkit.config.schema.sft import SFTConfig
from rlkit.config.schema.stats_logger import StatsLoggerConfig

_INDEXED = re.compile(r"(\w+)\[(\d+)\]")  # `auxiliary_models[0]`: one item of a list of sections


def get_field(config: Any, dotted: str) -> Any:
    """The value of a dotted field path (`launcher.slurm.partition`, `auxiliary_models[0].model_path`) of a config
    or one of its sections."""
    for part in dotted.split("."):
        indexed = _INDEXED.fullmatch(part)
        config = getattr(config, indexed[1])[int(indexed[2])] if indexed else getattr(config, part)
    return config


def set_field(config: Any, dotted: str, value: Any) -> None:
    """Set the value of a dotted field path."""
    parent, _, leaf = dotted.rpartition(".")
    setattr(get_field(config, parent) if parent else config, leaf, value)


CONTAINER_TYPES = ("apptainer", "none")
NAME_RESOLVE_TYPES = ("nfs", "etcd3")  # rlkit.nameresolve.make_name_resolve builds each


@dataclass
class NameResolveConfig:
    """Where the job's steps publish and find each other (servers register here)."""

    type: str = _f("nfs", "Key-value store for name resolving. Choices: nfs (a shared directory), etcd3.")
    nfs_record_root: str = _f(
        "", "Empty (recommended): NFS records live in the trial directory (<trial dir>/name_resolve/, private to you). "
            "Set: an absolute directory shared by all nodes; records go to <it>/<your uid>/<experiment>/<trial>/, "
            "made 0700 and refused if another user owns or can write them."
    )
    etcd3_addr: str = _f("localhost:2379", "host:port (or http(s):// URL) of the etcd3 server (type etcd3).")
    etcd3_cacert: str = _f("", "CA bundle that verifies etcd's TLS certificate (etcdctl --cacert); set: https.")
    etcd3_cert: str = _f("", "Client certificate for etcd's TLS client authentication (etcdctl --cert).")
    etcd3_key: str = _f("", "Private key of etcd3_cert (etcdctl --key).")
    etcd3_user: str = _f("", "etcd user (etcdctl --user); its password is read from $ETCDCTL_PASSWORD, never the "
                             "config. Empty: no authentication (anyone who reaches etcd can read and write records).")


@dataclass
class ClusterConfig:
    """The cluster the job runs on."""

    cluster_name: str = _f("local", "Name of the cluster: kept in the trial manifest, shown by `rlkit status TRIAL`.")
    fileroot: str = _f("/tmp/rlkit", "Root for trials, logs and checkpoints; must be on a filesystem all nodes share.")
    hub_cache: str = _f("", "Where `rlkit submit` downloads models and datasets given as Hugging Face hub ids (on the "
                            "login node; compute nodes never download); empty: <fileroot>/hub-cache.")
    n_nodes: int = _f(1, "Number of nodes the job may use in total.", ge=1)
    n_gpus_per_node: int = _f(8, "GPUs per node (physical).", ge=1)
    name_resolve: NameResolveConfig = _sub(NameResolveConfig, "Where the job's steps find each other (nfs or etcd3).")


@dataclass
class SlurmConfig:
    """How the heterogeneous Slurm job is requested and how its steps start."""

    partition: str = _f("", "Slurm partition (empty: the cluster's default).")
    account: str = _f("", "Slurm account to charge (empty: your default).")
    qos: str = _f("", "Slurm QOS (empty: default).")
    time: str = _f("", "Time limit: MM, MM:SS, HH:MM:SS or D-HH[:MM[:SS]] (90 is minutes), rendered as D-HH:MM:SS; "
                       "empty: the partition's default.")
    constraint: str = _f("", "Node features required (--constraint), e.g. a100.")
    nodelist: str = _f("", "Exact nodes to use (hostlist, e.g. gpu[01-03]); split in order over the job's components.")
    exclude: str = _f("", "Nodes never to use (hostlist).")
    srun_additional_args: str = _f("", "Extra arguments for every srun step, e.g. '--mpi=pmix'.")
    sbatch_additional_args: str = _f("", "Extra job-wide sbatch options (first component), e.g. '--mail-type=END'.")
    container_type: str = _f("apptainer", "How steps run: apptainer (each role in its image) or none (bare host).")
    mount: str = _f("", "Bind mounts for containers, comma-separated src:dst (fileroot is always bound).")
    trainer_image: str = _f("", "Apptainer image (.sif path or docker:// URI) for trainer and client steps.")
    inference_server_image: str = _f("", "Apptainer image (.sif path or docker:// URI) for inference servers.")
    apptainer_args: str = _f("--nv", "Arguments for `apptainer exec` before the image (GPU support: --nv).")


@dataclass
class LauncherConfig:
    """Resources per role and what each role's environment holds."""

    inference_server_cpus_per_gpu: int = _f(4, "CPUs per GPU for inference servers.", ge=1)
    inference_server_mem_per_gpu: int = _f(32768, "Memory (MB) per GPU for inference servers.", ge=1)
    trainer_cpus_per_gpu: int = _f(4, "CPUs per GPU for the trainer.", ge=1)
    trainer_mem_per_gpu: int = _f(32768, "Memory (MB) per GPU for the trainer.", ge=1)
    client_cpus: int = _f(4, "CPUs for a GPU-less client step (job type generate).", ge=1)
    client_mem: int = _f(8192, "Memory (MB) for a GPU-less client step.", ge=1)
    inference_server_env_vars: str = _f("", "Environment for inference servers, comma-separated, e.g. 'A=1,B=2'.")
    trainer_env_vars: str = _f("", "Environment for trainer and client steps, comma-separated, e.g. 'A=1,B=2'.")
    python: str = _f(
        "", "Python that runs rlkit steps. Empty: this interpreter (container_type none) or python3 (in images). "
            "An engine in another venv: vllm.python / sglang.python."
    )
    server_startup_timeout: float = _f(900.0, "Seconds a server may take to become healthy before its step fails.",
                                       gt=0)
    slurm: SlurmConfig = _sub(SlurmConfig, "The Slurm request: partition, account, time, nodes, containers.")


@dataclass
class VllmConfig:
    """vLLM server arguments (`python -m vllm.entrypoints.openai.api_server`)."""

    model: str = _f("", "Model the servers load; empty: actor.path.")
    seed: int = _f(1, "Sampling seed of the server.", ge=0, le=SEED_MAX)
    dtype: str = _f("bfloat16", "Weights and activation dtype.")
    max_model_len: int | None = _f(None, "Context length (prompt + completion); None: the model's own.", ge=1)
    gpu_memory_utilization: float = _f(0.9, "Fraction of GPU memory vLLM may use.", gt=0, le=1)
    max_num_seqs: int = _f(256, "Most sequences in one batch.", ge=1)
    enforce_eager: bool = _f(False, "No CUDA graphs, no torch.compile: a faster start, a slower decode on GPUs.")
    enable_prefix_caching: bool = _f(True, "Reuse KV of shared prompt prefixes (reset after every weight update).")
    extra_args: dict[str, Any] = _f({}, "More vLLM 0.32 options, e.g. {max_num_batched_tokens: 2048}; true: bare flag.")
    python: str = _f("", "Python the vLLM servers run with (rlkit must be importable there too); empty: the one "
                         "running the serve step.")
    env_vars: str = _f("", "Environment for vLLM servers only (also an auxiliary model's), e.g. 'A=1,B=2'; "
                           "set on top of launcher.inference_server_env_vars.")


@dataclass
class SGLangConfig:
    """SGLang server arguments (`python -m sglang.launch_server`)."""

    model_path: str = _f("", "Model the servers load; empty: actor.path.")
    random_seed: int = _f(1, "Sampling seed of the server.", ge=0, le=SEED_MAX)
    dtype: str = _f("bfloat16", "Weights and activation dtype.")
    context_length: int | None = _f(None, "Context length; None: the model's own.", ge=1)
    mem_fraction_static: float = _f(0.9, "Fraction of GPU memory for weights and KV cache.", gt=0, le=1)
    disable_radix_cache: bool = _f(False, "Disable prefix (radix) caching.")
    extra_args: dict[str, Any] = _f({}, "Further SGLang flags, e.g. {attention_backend: fa3}.")
    python: str = _f("", "Python of the SGLang install the servers run with (e.g. its own venv's); empty: the one "
                         "running the serve step.")
    env_vars: str = _f("", "Environment for SGLang servers only (also an auxiliary model's), e.g. 'A=1,B=2'; "
                           "set on top of launcher.inference_server_env_vars.")


@dataclass
class DatasetConfig:
    """A local dataset (jsonl or parquet)."""

    path: str = _f("", "Path of a .jsonl or .parquet file, or a directory of them; reasoning-gym or "
                       "reasoning-gym:<task>: rows generated in the job (grpo, ppo, opmd, distill, generate; the "
                       "reasoning_gym section).")
    type: str = _f("rl", "What the rows are for: rl, sft or generate.")
    split: str = _f("", "A hub dataset id's split to read; empty: train for train_dataset, test for valid_dataset.")
    batch_size: int = _f(1, "Rows per batch; train_dataset: rows per training step (grpo, ppo: prompts, "
                                   "each sampled gconfig.n_samples times).", ge=1)
    shuffle: bool = _f(True, "Shuffle rows each epoch.")
    max_length: int | None = _f(None, "Drop rows whose prompt (sft: whole row; rw, dpo: prompt and answer) has more "
                                      "tokens than this; sft's null: actor.mb_spec.max_tokens_per_mb.", ge=1)
    prompt_key: str = _f("prompt", "Column holding the prompt: a string, a list of chat messages, or token ids.")
    tools_key: str = _f(
        "tools", "Prompt rows (grpo and its family, valid_dataset's evaluation, generate.dataset): column holding a "
                 "row's tools, a list of function schemas or a JSON string of one, given to the chat template as "
                 "`tools` when the prompt is rendered, so the model sees the functions it may call (single-turn "
                 "tool calling; the reward function gets the row, this column included). Default 'tools': "
                 "Trinity-RFT's taskset format.tools_key default and the column TRL's SFTTrainer and rlkit's "
                 "sft.tools_key read (TRL's GRPOTrainer renders the trainer's own tools and hands a dataset's tools "
                 "column to the reward functions only). A row without the column (or null, empty) has no tools; "
                 "tools with a prompt sent as raw text or token ids, a template that ignores them, or rollout.agent "
                 "(an episode offers the workflow's tools) are refused naming the row. Empty: no column is read. "
                 "sft rows (job type sft, a mix's expert_dataset) are read with sft.tools_key instead.")


@dataclass
class GenerationHyperparameters:
    """Sampling settings for every request."""

    n_samples: int = _f(1, "Completions per prompt.", ge=1)
    max_new_tokens: int = _f(16384, "Most tokens per completion.", ge=1)
    min_new_tokens: int = _f(0, "Fewest tokens per completion: the model's EOS cannot end one sooner (vLLM's "
                                "min_tokens, SGLang's min_new_tokens); at most max_new_tokens; 0: off.")
    temperature: float = _f(1.0, "Sampling temperature (0: greedy).", ge=0)
    top_p: float = _f(1.0, "Nucleus sampling probability mass.", gt=0, le=1)
    top_k: int = _f(-1, "Top-k sampling; -1: off.")
    stop: list[str] = _f([], "Stop strings.")
    greedy: bool = _f(False, "Greedy decoding (AReaL's gconfig.greedy): requests go at temperature 0, top_p 1, top_k "
                             "-1 whatever those fields say; for generate and evaluation only (a GRPO/PPO rollout "
                             "must sample).")


@dataclass
class RolloutConfig:
    """How clients talk to the inference servers."""

    max_concurrent_rollouts: int = _f(64, "Most requests in flight across all servers.", ge=1)
    queue_size: int | None = _f(None, "Most finished groups waiting for the trainer; None: 2 training batches.", ge=1)
    consumer_batch_size: int = _f(1, "Groups the trainer takes per training step; grpo sets it to "
                                  "train_dataset.batch_size when left at 1.", ge=1)
    max_head_offpolicyness: int = _f(0, "A sample may be this many weight versions behind the trainer; older "
                                     "ones are dropped (0: on-policy).", ge=0)
    request_timeout: float = _f(3600.0, "Seconds one request may take.", gt=0)
    request_retries: int = _f(3, "Retries of a failed request (on another server when one is left).", ge=0)
    setup_timeout: float = _f(1200.0, "Seconds to wait for the servers to register before giving up.", gt=0)
    server_silence_timeout: float = _f(30.0, "Seconds a server may leave GET /health unanswered (probed every 5 to "
                                       "10 s) before its in-flight requests go to the other servers, its part of a "
                                       "weight push is dropped, and pushes skip it until it answers again.", ge=5)
    agent: AgentConfig = _sub(AgentConfig, "Multi-turn, tool-using episodes (empty workflow: single-turn rollouts).")


@dataclass
class GenerateConfig:
    """Job type generate: batch generation over a dataset."""

    dataset: DatasetConfig = _sub(DatasetConfig, "Prompts to complete.")
    output_file: str = _f("completions.jsonl", "Output file, relative to the trial directory.")
    apply_chat_template: bool = _f(False, "Wrap string prompts in the tokenizer's chat template.")
    max_prompts: int | None = _f(None, "Complete only the first N prompts.", ge=1)
    score: bool = _f(False, "Score every completion with the reward section as training scores it (reward.fn or "
                            "reward.fns): each line gains its reward, and summary.json in the trial directory holds "
                            "the mean reward, pass@k and mean@n, failed and timed-out calls.")
    pass_threshold: float = _f(1.0, "With score: a completion passes (pass@k) when its reward is at least this.")


@dataclass
class RewardConfig:
    """How completions are scored."""

    fn: str = _f("math", "Reward: math (boxed or last number vs the answer), exact_match, none (0 for every "
                 "completion: job type distill without a reward), reasoning_gym (the task's own score_answer, for "
                 "rows of train_dataset.path or generate.dataset.path reasoning-gym), reward_model (a trained "
                 "rw model, reward_model_path), or module.path:function called as fn(prompt, completion, row) -> "
                 "float.")
    answer_key: str = _f("answer", "Dataset column with the reference answer (math and exact_match), or a dotted "
                                   "path to a nested field: reward_model.ground_truth reads verl's rows "
                                   "(reward_model: {ground_truth: ...}); a column of that exact name wins. A "
                                   "list there holds accepted answers: any of them scores.")
    reward_model_path: str = _f("", "With fn=reward_model: a reward model trained by job type rw (its "
                                "checkpoints/final directory), or one trained elsewhere as a Hugging Face "
                                "*ForSequenceClassification with one label (directory or hub id; it reads the "
                                "conversation through its own chat template); completions are scored by its "
                                "servers (reward_model_engine_num), else on trainer rank 0's CPU.")
    reward_model_engine_num: int = _f(0, "With fn=reward_model: vLLM servers of the reward model (a pooling runner, "
                                      "steps aux-reward_model-<i>), each on reward_model_tensor_parallel_size GPUs "
                                      "of its own, that score every completion; 0: trainer rank 0 scores on its CPU "
                                      "in one worker (fine for a small model; a model of billions of parameters "
                                      "would take seconds a completion).", ge=0)
    reward_model_tensor_parallel_size: int = _f(1, "GPUs per reward-model server (they must fit on one node).",
                                                ge=1)
    reward_model_max_model_len: int | None = _f(None, "Context length (prompt + completion) of the reward-model "
                                                      "servers; None: the model's own.", ge=1)
    timeout: float = _f(10.0, "Seconds one reward call may take; slower calls score 0 and are counted.", gt=0)
    fns: dict[str, float] = _f({}, "A weighted mix instead of fn: {function: weight}, each function as fn names one "
                               "(cosmos-rl's reward_function dict); the reward is the weighted sum, each function's "
                               "mean, errors and timeouts are logged as reward/fn/<name>/*; a negative weight makes "
                               "a penalty (as TRL's reward_weights), 0 logs the function only; empty: fn alone.")
    timeouts: dict[str, float] = _f({}, "Per function of fns: seconds one call may take (missing: timeout).")
    num_workers: int = _f(4, "Processes that call a reward function (each of fns its own), started as calls need "
                             "them; each imports the function and runs its warmup() once. reward_model: always one.",
                          ge=1)


@dataclass
class SaverConfig:
    """When Hugging Face format models are saved (under the trial's checkpoints/ directory)."""

    freq_steps: int | None = _f(None, "Save every N steps; None: off.", ge=1)
    freq_epochs: int | None = _f(None, "Save every N epochs; None: off.", ge=1)
    freq_secs: int | None = _f(None, "Save when N seconds passed since the last save; None: off.", ge=1)
    write_timeout: float = _f(7200.0, "Seconds trainer rank 0 may take to write one checkpoint alone while the other "
                              "ranks wait for it: a save under checkpoints/, or its part of a recover checkpoint "
                              "(the loop state, the seal, the pruning of older ones); past it they end the step "
                              "naming what rank 0 was writing. A 70B model on a slow shared filesystem can take "
                              "longer than torch's 30-minute collective timeout.", gt=0)


@dataclass
class RecoverConfig:
    """Recover checkpoints (model, optimizer, data position, RNG) and automatic retries; see `rlkit resume`."""

    mode: str = _f("auto", "disabled: never resume; auto: resume when a valid checkpoint exists; fault: resume only "
                   "after a failure of this trial (retry, requeue); resume: must resume (error if nothing to resume).")
    freq_steps: int | None = _f(None, "Checkpoint every N steps; None: off.", ge=1)
    freq_epochs: int | None = _f(None, "Checkpoint every N epochs; None: off.", ge=1)
    freq_secs: int | None = _f(1800, "Checkpoint when N seconds passed since the last one; None: off.", ge=1)
    retries: int = _f(3, "Times a failed trainer step is restarted in the allocation, and times the job requeues "
                      "itself at its time limit.", ge=0)
    keep_last: int = _f(2, "Valid checkpoints kept (older ones are removed).", ge=1)
    rank_silence_timeout: float = _f(120.0, "Seconds a trainer rank may go without a heartbeat (a thread of its "
                                     "process, every few seconds: a stopped or frozen process, a node in trouble) "
                                     "before the other ranks end the step naming it, and the job restarts it from the "
                                     "last checkpoint (recover.retries).", ge=10)
    time_limit_warning: int = _f(300, "Seconds before the time limit at which Slurm warns the job (USR1) so the "
                                 "trainer checkpoints and the job requeues itself.")


@dataclass
class ExperimentConfig:
    """One experiment trial: what to run and where."""

    experiment_name: str = _f(MISSING, "Name of the experiment: letters, digits, '.', '_', '-' (no '/').")
    trial_name: str = _f(MISSING, "Name of the trial: letters, digits, '.', '_', '-' (no '/').")
    type: str = _f("generate", "Job type: a name registered in rlkit.jobs (an unknown name is refused with the list).")
    allocation_mode: str = _f(
        MISSING, "GPU layout, e.g. vllm:d2t2+fsdp:d4 (d data-parallel, t tensor-parallel, + separate GPUs)."
    )
    seed: int = _f(1, "Random seed of the trainer (data order, initialisation).", ge=0, le=SEED_MAX)
    tokenizer_path: str = _f("", "Tokenizer directory; empty: the model's.")
    auxiliary_models: list[AuxiliaryModelConfig] = _f(
        [], "Extra models served beside the policy for reward functions (e.g. an LLM judge), each its own server "
            "group in the job, reached with rlkit.rewards.auxiliary.auxiliary_model(name) (grpo, ppo); the teacher "
            "of job type distill (distill.teacher).")
    cluster: ClusterConfig = _sub(ClusterConfig, "The cluster: shared file root, nodes, GPUs per node, name resolving.")
    launcher: LauncherConfig = _sub(
        LauncherConfig, "CPUs, memory and environment of each role's steps, and the Slurm request.")
    vllm: VllmConfig = _sub(VllmConfig, "vLLM servers (the vllm part of allocation_mode).")
    sglang: SGLangConfig = _sub(SGLangConfig, "SGLang servers (the sglang part of allocation_mode).")
    actor: ActorConfig = _sub(ActorConfig, "The trained model: weights, optimizer, micro-batching, PPO/GRPO loss, "
                                                  "LoRA, weight updates.")
    critic: CriticConfig = _sub(CriticConfig, "Value model (job type ppo).")
    ref: RefConfig = _sub(RefConfig, "Frozen reference model of the KL terms (grpo, ppo) and of dpo.")
    gconfig: GenerationHyperparameters = _sub(GenerationHyperparameters, "Sampling of every request (rollouts, "
                                                                                 "generate).")
    rollout: RolloutConfig = _sub(RolloutConfig, "Requests to the servers: concurrency, staleness, timeouts, "
                                                  "multi-turn agent episodes.")
    generate: GenerateConfig = _sub(GenerateConfig, "Job type generate.")
    rw: RWConfig = _sub(RWConfig, "Job type rw (reward model on chosen/rejected pairs).")
    dpo: DPOConfig = _sub(DPOConfig, "Job type dpo (chosen/rejected pairs against a frozen reference).")
    train_dataset: DatasetConfig = _sub(
        DatasetConfig, "Training rows: prompts (grpo, ppo) or examples (sft, rw, dpo); batch_size rows per step.")
    valid_dataset: DatasetConfig = _sub(
        DatasetConfig, "Validation rows (the evaluator of grpo and ppo; sft, rw, dpo at epoch ends); empty path: none.")
    reward: RewardConfig = _sub(RewardConfig, "Reward function (grpo, ppo, opmd, distill; generate with "
                                              "generate.score).")
    reasoning_gym: ReasoningGymConfig = _sub(ReasoningGymConfig, "reasoning-gym's tasks as the dataset "
                                             "(train_dataset.path or generate.dataset.path reasoning-gym): tasks and "
                                             "weights, size, seeds.")
    expert_dataset: DatasetConfig = _sub(
        DatasetConfig, "SFT+RL mix (grpo, ppo, opmd): expert rows in the sft section's format, batch_size of them "
        "per step, their SFT loss weighted by mix.mu; empty path: no mix.")
    mix: MixConfig = _sub(MixConfig, "SFT+RL mix: the weight of the expert rows' loss.")
    opmd: OPMDConfig = _sub(OPMDConfig, "Job type opmd: tau and the group baseline.")
    sft: SFTConfig = _sub(SFTConfig, "Job type sft: the dataset's row format.")
    distill: DistillConfig = _sub(DistillConfig, "Job type distill: on-policy distillation from a teacher served as "
                                  "an auxiliary model.")
    total_train_epochs: int = _f(1, "Passes over the training set.", ge=1)
    total_train_steps: int | None = _f(None, "Stop after this many steps; None: run the epochs.", ge=1)
    async_training: bool = _f(True, "Generate the next batches while training (false: synchronous GRPO).")
    saver: SaverConfig = _sub(SaverConfig, "When Hugging Face models are saved (trial's checkpoints/).")
    evaluator: EvaluatorConfig = _sub(EvaluatorConfig, "Evaluation on valid_dataset during training (grpo, ppo).")
    eval_gconfig: EvalGenerationConfig = _sub(EvalGenerationConfig, "Sampling of evaluations (None fields: gconfig).")
    recover: RecoverConfig = _sub(RecoverConfig, "Recover checkpoints, retries of failed steps, requeues at the "
                                                  "time limit.")
    stats_logger: StatsLoggerConfig = _sub(StatsLoggerConfig, "Where metrics go besides metrics.jsonl: "
                                                               "TensorBoard, W&B, SwanLab.")


def agent_limits(config: ExperimentConfig, context: int | None) -> tuple[int, int, int]:
    """(max_turns, max_total_tokens, max_tokens_per_turn) of an episode; `context`: the servers' context length."""
    agent = config.rollout.agent
    per_turn = agent.max_tokens_per_turn or config.gconfig.max_new_tokens
    return agent.max_turns, agent.engine_max_tokens or context or DEFAULT_MAX_TOTAL_TOKENS, per_turn
