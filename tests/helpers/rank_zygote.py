"""A zygote for the tests' gloo ranks: one process imports torch, transformers, peft and the trainer once, then forks
one child per rank asked for (the fork server: tests/helpers/zygote.py). A rank started with `python -c` spends ~9
CPU-s importing those before its first line (measured on the 2-core dev machine; about 70 ranks per suite run), which
the fork shares instead.

What the rank runs is unchanged: the same `-c` source and arguments, its own environment (RANK, WORLD_SIZE and
fault-injection variables are the rank's), working directory, stdin from /dev/null and stdout+stderr into one pipe of
the test process. Only the interpreter start differs; the cluster trials start their trainers with srun as users do.
The zygote never initialises torch's thread pools or torch.distributed before forking.
"""

from __future__ import annotations

import os

from tests.helpers.zygote import ForkedProcess, Zygote

PRELOAD = ("torch", "torch.distributed.fsdp", "torch.distributed.tensor", "transformers",
           "transformers.models.qwen2.modeling_qwen2", "peft", "safetensors.torch", "rlkit.trainer.engine")

ZYGOTE_PROCESS = Zygote("rank", PRELOAD, {**os.environ, "OMP_NUM_THREADS": "1"})  # libgomp reads it at torch's import


class ForkedRank(ForkedProcess):
    """One rank forked by the zygote, read like a `subprocess.Popen` with stdout=PIPE, stderr=STDOUT, text=True."""

    def __init__(self, source: str, args: list[str], env: dict[str, str]) -> None:
        super().__init__(ZYGOTE_PROCESS, {"source": source, "args": args, "env": env, "cwd": os.getcwd()},
                         split_stderr=False)
