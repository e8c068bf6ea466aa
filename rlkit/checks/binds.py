"""What the Apptainer containers of a job see: the user's binds (`launcher.slurm.mount`) plus the ones rlkit derives
for every path the steps use at its host path (the fileroot, the name-resolve root, the models and the datasets).

The failure this prevents is one users meet after hours in the queue: a bind such as `/lustre:/data` moves the
fileroot `/lustre/me/rlkit` to `/data/me/rlkit` inside the container, or `/scratch/x:/models` lays another
directory over the model, and the steps, which use host paths, never find their files (servers that never see each
other's records, a trainer that cannot load the model). Each such bind is refused at submit, naming the path, the
field and the fix; a bind source that does not exist here is refused too (the fileroot and binds are on the
shared filesystem, so the login node sees them as the nodes do).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from rlkit.config.model_config import is_local_path
from rlkit.config.problems import Problems
from rlkit.config.schema.auxiliary import model_path_fields
from rlkit.config.schema.experiment import ExperimentConfig, get_field
from rlkit.errors import ConfigError

MODEL_FIELDS = ("actor.path", "tokenizer_path", "critic.path", "ref.path", "dpo.ref_path",
                "reward.reward_model_path", "vllm.model", "sglang.model_path")
DATA_FIELDS = ("train_dataset.path", "valid_dataset.path", "expert_dataset.path", "generate.dataset.path")
_MOUNT_FIELD = "launcher.slurm.mount"


@dataclass(frozen=True)
class Bind:
    """One `src:dst[:opts]` bind."""

    src: str
    dst: str
    opts: str = ""

    @classmethod
    def parse(cls, item: str) -> Bind:
        parts = item.split(":")
        if len(parts) not in (2, 3) or not all(p.startswith("/") for p in parts[:2]):
            raise ConfigError(f"{_MOUNT_FIELD}: '{item}' is not /host/path:/container/path[:ro]",
                              hint=f"e.g. {_MOUNT_FIELD}=/storage:/storage,/scratch:/scratch")
        return cls(os.path.normpath(parts[0]), os.path.normpath(parts[1]), parts[2] if len(parts) == 3 else "")

    def text(self) -> str:
        return f"{self.src}:{self.dst}" + (f":{self.opts}" if self.opts else "")


def is_under(path: str, root: str) -> bool:
    """Whether `path` is `root` or lies below it (both absolute)."""
    path, root = path.rstrip("/") or "/", root.rstrip("/") or "/"
    return path == root or path.startswith(root + "/") or root == "/"


def parse_mounts(text: str) -> list[Bind]:
    """'src:dst,src2:dst2:ro' -> binds; both sides absolute paths."""
    return [Bind.parse(item) for item in filter(None, (part.strip() for part in text.split(",")))]


def user_code_files(config: ExperimentConfig) -> list[tuple[str, str]]:
    """(field, file) of the user's code named by file path (/abs/path/file.py:function): rollout.agent's workflow,
    tool-call parser, tools and agent program, which the trainer imports (or runs) inside its container."""
    agent = config.rollout.agent
    named = [("rollout.agent.workflow", agent.workflow), ("rollout.agent.tool_call_parser", agent.tool_call_parser),
             *((f"rollout.agent.tools[{i}]", tool) for i, tool in enumerate(agent.tools)),
             ("rollout.agent.openai.agent", agent.openai.agent)]
    files = [(field, spec.strip().rpartition(":")[0]) for field, spec in named
             if spec.strip().startswith("/") and spec.strip().rpartition(":")[0].endswith(".py")]
    program = agent.openai.command[0] if agent.openai.command else ""
    if isinstance(program, str) and program.startswith("/"):  # the agent command's own file
        files.append(("rollout.agent.openai.command[0]", program))
    return files


def host_paths(config: ExperimentConfig) -> list[tuple[str, str]]:
    """(field, absolute host path) of every path the steps use inside the containers at its host path (a dataset
    file itself: binding its directory could mean binding `/`)."""
    nr = config.cluster.name_resolve
    paths = [("cluster.fileroot", config.cluster.fileroot), ("cluster.name_resolve.nfs_record_root",
                                                              nr.nfs_record_root if nr.type == "nfs" else "")]
    if nr.type == "etcd3":
        paths += [(f"cluster.name_resolve.{k}", getattr(nr, k)) for k in ("etcd3_cacert", "etcd3_cert", "etcd3_key")]
    for field in (*MODEL_FIELDS, *model_path_fields(config)):
        value = get_field(config, field)
        if isinstance(value, str) and value and is_local_path(value):
            paths.append((field, value))
    for field in DATA_FIELDS:
        value = get_field(config, field)
        if isinstance(value, str) and value.startswith("/"):
            paths.append((field, value))
    paths += user_code_files(config)
    return [(field, os.path.normpath(path)) for field, path in paths if path.startswith("/") and path != "/"]


def container_binds(config: ExperimentConfig) -> tuple[list[Bind], list[Bind]]:
    """The user's binds and the ones rlkit adds: each host path no bind shows at the same path gets `path:path`
    (checked by `check_binds` first, so no user bind moves or covers it), in the order shortest first."""
    user = parse_mounts(config.launcher.slurm.mount)
    added: list[Bind] = []
    # a parent first (its children need none); equal lengths by name, so the rendered script is the same every run
    for path in sorted({path for _, path in host_paths(config)}, key=lambda path: (len(path), path)):
        if not any(is_under(path, b.src) and b.src == b.dst for b in (*user, *added)):
            added.append(Bind(path, path))
    return user, added


def check_binds(config: ExperimentConfig, problems: Problems) -> None:
    """Every bind readable, every source present, and no bind that moves or covers a path the steps use."""
    try:
        user = parse_mounts(config.launcher.slurm.mount)
    except ConfigError as exc:
        problems.errors.append(exc)
        return
    for bind in user:
        if not os.path.exists(bind.src):
            problems.add(f"{_MOUNT_FIELD}: the source of '{bind.text()}' does not exist here (binds are on the shared "
                         "filesystem, seen by this node as by the compute nodes)",
                         hint="fix the path, or remove the bind", site=True)
    for field, path in host_paths(config):
        for bind in user:
            if bind.src == bind.dst:
                continue
            if is_under(path, bind.src):
                inside = bind.dst + path[len(bind.src.rstrip("/")):]
                problems.add(f"{_MOUNT_FIELD} '{bind.text()}' moves {field} ({path}) to {inside} inside the "
                             "container, but the steps use the host path",
                             hint=f"bind it at the same path ({bind.src}:{bind.src}), or point {field} elsewhere")
            elif is_under(path, bind.dst):
                problems.add(f"{_MOUNT_FIELD} '{bind.text()}' lays {bind.src} over {field} ({path}) inside the "
                             "container: the steps would not see it",
                             hint=f"bind {bind.src} elsewhere, or bind {path} at the same path instead")
