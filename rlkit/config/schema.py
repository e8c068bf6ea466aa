"""The experiment schema: dataclasses read by OmegaConf. Importable without torch or vLLM (login nodes stay fast).

Field names follow AReaL, which most of our users come from. Every field has a one-line `help` that
`rlkit config-help` prints. Later job types add their sections here (actor training fields, saver, recover, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


def _f(default: Any, help: str) -> Any:
    """A field with a default and a one-line help text."""
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _sub(cls: type, help: str) -> Any:
    """A nested section."""
    return field(default_factory=cls, metadata={"help": help})


JOB_TYPES = ("generate", "grpo")
SUBMITTABLE_JOB_TYPES = ("generate",)  # grpo is planned and rendered; its trainer step arrives with training
CONTAINER_TYPES = ("apptainer", "none")
NAME_RESOLVE_TYPES = ("nfs", "etcd3")


@dataclass
class NameResolveConfig:
    """Where the job's steps publish and find each other (servers register here)."""

    type: str = _f("nfs", "Key-value store for name resolving. Choices: nfs (a shared directory), etcd3.")
    nfs_record_root: str = _f(
        "${cluster.fileroot}/name_resolve", "Record root for NFS name resolving; must be shared by all nodes."
    )
    etcd3_addr: str = _f("localhost:2379", "host:port of the etcd3 server (type etcd3).")


@dataclass
class ClusterConfig:
    """The cluster the job runs on."""

    cluster_name: str = _f("local", "Name of the cluster (shown in status; used for site-specific settings).")
    fileroot: str = _f("/tmp/rlkit", "Root for trials, logs and checkpoints; must be on a filesystem all nodes share.")
    n_nodes: int = _f(1, "Number of nodes the job may use in total.")
    n_gpus_per_node: int = _f(8, "GPUs per node (physical).")
    name_resolve: NameResolveConfig = _sub(NameResolveConfig, "Name-resolve store.")


@dataclass
class SlurmConfig:
    """How the heterogeneous Slurm job is requested and how its steps start."""

    partition: str = _f("", "Slurm partition (empty: the cluster's default).")
    account: str = _f("", "Slurm account to charge (empty: your default).")
    qos: str = _f("", "Slurm QOS (empty: default).")
    time: str = _f("", "Time limit, e.g. 2-00:00:00 or 90 (minutes); empty: the partition's default.")
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

    inference_server_cpus_per_gpu: int = _f(4, "CPUs per GPU for inference servers.")
    inference_server_mem_per_gpu: int = _f(32768, "Memory (MB) per GPU for inference servers.")
    trainer_cpus_per_gpu: int = _f(4, "CPUs per GPU for the trainer.")
    trainer_mem_per_gpu: int = _f(32768, "Memory (MB) per GPU for the trainer.")
    client_cpus: int = _f(4, "CPUs for a GPU-less client step (job type generate).")
    client_mem: int = _f(8192, "Memory (MB) for a GPU-less client step.")
    inference_server_env_vars: str = _f("", "Environment for inference servers, comma-separated, e.g. 'A=1,B=2'.")
    trainer_env_vars: str = _f("", "Environment for trainer and client steps, comma-separated, e.g. 'A=1,B=2'.")
    python: str = _f(
        "", "Python that runs rlkit steps. Empty: this interpreter (container_type none) or python3 (in images)."
    )
    server_startup_timeout: float = _f(900.0, "Seconds a server may take to become healthy before its step fails.")
    slurm: SlurmConfig = _sub(SlurmConfig, "Slurm settings.")


@dataclass
class VllmConfig:
    """vLLM server arguments (`python -m vllm.entrypoints.openai.api_server`)."""

    model: str = _f("", "Model the servers load; empty: actor.path.")
    seed: int = _f(1, "Sampling seed of the server.")
    dtype: str = _f("bfloat16", "Weights and activation dtype.")
    max_model_len: int | None = _f(None, "Context length (prompt + completion); None: the model's own.")
    gpu_memory_utilization: float = _f(0.9, "Fraction of GPU memory vLLM may use.")
    max_num_seqs: int = _f(256, "Most sequences in one batch.")
    enforce_eager: bool = _f(False, "Disable CUDA graphs.")
    enable_prefix_caching: bool = _f(True, "Reuse KV of shared prompt prefixes (reset after every weight update).")
    extra_args: dict[str, Any] = _f({}, "Further vLLM flags, e.g. {swap_space: 4}; true gives a bare flag.")


@dataclass
class SGLangConfig:
    """SGLang server arguments (`python -m sglang.launch_server`)."""

    model_path: str = _f("", "Model the servers load; empty: actor.path.")
    random_seed: int = _f(1, "Sampling seed of the server.")
    dtype: str = _f("bfloat16", "Weights and activation dtype.")
    context_length: int | None = _f(None, "Context length; None: the model's own.")
    mem_fraction_static: float = _f(0.9, "Fraction of GPU memory for weights and KV cache.")
    disable_radix_cache: bool = _f(False, "Disable prefix (radix) caching.")
    extra_args: dict[str, Any] = _f({}, "Further SGLang flags, e.g. {attention_backend: fa3}.")


@dataclass
class ActorConfig:
    """The policy model (the training fields arrive with the training job types)."""

    path: str = _f("", "Hugging Face model directory (weights + tokenizer).")


@dataclass
class DatasetConfig:
    """A local dataset (jsonl or parquet)."""

    path: str = _f("", "Path of a .jsonl or .parquet file, or a directory of them.")
    type: str = _f("rl", "What the rows are for: rl, sft or generate.")
    batch_size: int = _f(1, "Rows per batch.")
    shuffle: bool = _f(True, "Shuffle rows each epoch.")
    max_length: int | None = _f(None, "Drop rows whose prompt has more tokens than this.")
    prompt_key: str = _f("prompt", "Column holding the prompt: a string, a list of chat messages, or token ids.")


@dataclass
class GenerationHyperparameters:
    """Sampling settings for every request."""

    n_samples: int = _f(1, "Completions per prompt.")
    max_new_tokens: int = _f(16384, "Most tokens per completion.")
    temperature: float = _f(1.0, "Sampling temperature (0: greedy).")
    top_p: float = _f(1.0, "Nucleus sampling probability mass.")
    top_k: int = _f(-1, "Top-k sampling; -1: off.")
    stop: list[str] = _f([], "Stop strings.")


@dataclass
class RolloutConfig:
    """How clients talk to the inference servers."""

    max_concurrent_rollouts: int = _f(64, "Most requests in flight across all servers.")
    request_timeout: float = _f(3600.0, "Seconds one request may take.")
    request_retries: int = _f(3, "Retries of a failed request (on another server when one is left).")
    setup_timeout: float = _f(1200.0, "Seconds to wait for the servers to register before giving up.")


@dataclass
class GenerateConfig:
    """Job type generate: batch generation over a dataset."""

    dataset: DatasetConfig = _sub(DatasetConfig, "Prompts to complete.")
    output_file: str = _f("completions.jsonl", "Output file, relative to the trial directory.")
    apply_chat_template: bool = _f(False, "Wrap string prompts in the tokenizer's chat template.")
    max_prompts: int | None = _f(None, "Complete only the first N prompts.")


@dataclass
class ExperimentConfig:
    """One experiment trial: what to run and where."""

    experiment_name: str = _f(MISSING, "Name of the experiment (no '_' or '/').")
    trial_name: str = _f(MISSING, "Name of the trial (no '-' or '/').")
    type: str = _f("generate", "Job type. Choices: generate (batch generation), grpo (render only for now).")
    allocation_mode: str = _f(
        MISSING, "GPU layout, e.g. vllm:d2t2+fsdp:d4 (d data-parallel, t tensor-parallel, + separate GPUs)."
    )
    seed: int = _f(1, "Random seed.")
    tokenizer_path: str = _f("", "Tokenizer directory; empty: the model's.")
    cluster: ClusterConfig = _sub(ClusterConfig, "Cluster.")
    launcher: LauncherConfig = _sub(LauncherConfig, "Launcher.")
    vllm: VllmConfig = _sub(VllmConfig, "vLLM servers.")
    sglang: SGLangConfig = _sub(SGLangConfig, "SGLang servers.")
    actor: ActorConfig = _sub(ActorConfig, "Policy model.")
    gconfig: GenerationHyperparameters = _sub(GenerationHyperparameters, "Sampling.")
    rollout: RolloutConfig = _sub(RolloutConfig, "Client-server traffic.")
    generate: GenerateConfig = _sub(GenerateConfig, "Job type generate.")
