"""What Slurm tells a step about where it runs, read in one place (torch-free; like submitit's JobEnvironment).

Inside `srun`, each task learns its place from SLURM_* variables: its rank among the step's tasks, its rank on its
node, the step's size, its node, the job and step ids, how often the job was requeued, and the nodes it holds.
Every in-job module asks a JobEnv instead of reading those variables itself, so their names and fallbacks (a step
started outside Slurm: rank 0 of 1, empty ids) are decided here once.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from rlkit.step_contract import SLICE_MARK


def advertised_host() -> str:
    """The address other nodes use to reach this one ($RLKIT_ADVERTISE_HOST overrides the host name)."""
    return os.environ.get("RLKIT_ADVERTISE_HOST") or socket.gethostname()


def _int(environ: Mapping[str, str], name: str, default: int) -> int:
    value = environ.get(name, "")
    return int(value) if value.strip() else default


@dataclass(frozen=True)
class JobEnv:
    """One task's view of its Slurm job. `in_step`: started by srun (SLURM_PROCID is set); outside a step the
    rank fields describe a single process."""

    in_step: bool
    global_rank: int
    local_rank: int
    world_size: int
    node_index: int  # this node's place among the step's nodes (0: its first node)
    node_name: str
    job_id: str
    step_id: str
    restart_count: int
    nodelist: str
    gpus: str = ""  # the GPUs this step holds on this node (SLURM_STEP_GPUS, else CUDA_VISIBLE_DEVICES); "": none

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> JobEnv:
        env = os.environ if environ is None else environ
        return cls(
            in_step="SLURM_PROCID" in env,
            global_rank=_int(env, "SLURM_PROCID", 0),
            local_rank=_int(env, "SLURM_LOCALID", 0),
            # the step's task count; a batch script (no step yet) only knows the job's
            world_size=_int(env, "SLURM_STEP_NUM_TASKS", _int(env, "SLURM_NTASKS", 1)),
            node_index=_int(env, "SLURM_NODEID", 0),
            node_name=env.get("SLURMD_NODENAME") or socket.gethostname(),
            job_id=env.get("SLURM_JOB_ID", ""),
            step_id=env.get("SLURM_STEP_ID", ""),
            restart_count=_int(env, "SLURM_RESTART_COUNT", 0),
            nodelist=env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST", ""),
            gpus=env.get("SLURM_STEP_GPUS") or env.get("CUDA_VISIBLE_DEVICES", ""),
        )

    def slice_line(self, step: str) -> str:
        """The line a step prints first in its log: which node it runs on and which of its GPUs it holds (steps of
        a packed job share nodes, each with its own slice; rlkit status reads the last such line of each log)."""
        return f"{SLICE_MARK} {step} on {self.node_name} holds GPUs {self.gpus or 'none'}"
