"""What only rank 0 of the training loop (rlkit.trainer.loop) does, for every algorithm: metrics, progress.json, when
to save (saver and recover), the recover checkpoint's rank-0 part, the saver's Hugging Face export.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlkit import untrusted_json
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.slurm.faults import fault_point
from rlkit.step_contract import EXIT_FAILING, EXIT_STOPPED, step_state_text
from rlkit.trainer import recover
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import write_atomic

BOOKS_MARGIN_S = 600.0  # rank 0's metrics and progress.json around its checkpoint writes


def checkpoint_wait_s(config: ExperimentConfig) -> float:
    """How long the other ranks wait for rank 0's checkpoint writes between two of its broadcasts: two of
    saver.write_timeout (the last step's save and checkpoints/final; a leftover temp dir cleared, then a recover
    checkpoint's seal and pruning, each wait has at most two) and the bookkeeping around them."""
    return 2 * config.saver.write_timeout + BOOKS_MARGIN_S


def recording(step: int, saves: list[str]) -> str:
    """What rank 0 does alone after `step`'s gathered weights (named by the other ranks if it passes its bound)."""
    written = " and ".join(f"checkpoints/{name}" for name in saves)
    return f"write {written} (the save of step {step})" if saves else f"record step {step} (metrics, progress.json)"


@dataclass
class Saver:
    """Decides when to save a Hugging Face checkpoint (saver.freq_steps / freq_epochs / freq_secs)."""

    freq_steps: int | None
    freq_epochs: int | None
    freq_secs: int | None
    last_time: float
    last_epoch: int = 0

    def due(self, step: int, epoch: int, now: float) -> bool:
        hit = bool(self.freq_steps and step % self.freq_steps == 0)
        hit |= bool(self.freq_epochs and epoch > self.last_epoch and epoch % self.freq_epochs == 0)
        hit |= bool(self.freq_secs and now - self.last_time >= self.freq_secs)
        if hit:
            self.last_time, self.last_epoch = now, epoch
        return hit


def drop_metrics_after(path: Path, step: int) -> None:
    """Resuming after `step`: move the metrics of later (lost) steps out of metrics.jsonl, so steps stay unique."""
    if not path.is_file():
        return
    kept: list[str] = []
    dropped: list[str] = []
    for line in path.read_bytes().decode("utf-8", errors="replace").splitlines():
        try:
            record = untrusted_json.loads(line)
        except ValueError:
            continue  # a line cut by the crash
        record_step = record.get("step", 0) if isinstance(record, dict) else None
        if isinstance(record_step, bool) or not isinstance(record_step, int | float):
            dropped.append(line)  # not a record of a step (a damaged or foreign line): kept aside, never a traceback
            continue
        (kept if record_step <= step else dropped).append(line)
    if dropped:
        with open(path.with_name("metrics.discarded.jsonl"), "a") as f:
            f.write("\n".join(dropped) + "\n")
    write_atomic(path, "".join(line + "\n" for line in kept))


class LoopRank0:
    """Rank 0's bookkeeping of the loop: metrics sink, progress.json, savers, recover checkpoints."""

    def __init__(self, config: ExperimentConfig, paths: TrialPaths, steps: int, resumed_step: int | None) -> None:
        from rlkit.trainer.stats_logger import StatsLogger

        self.config, self.paths, self.steps = config, paths, steps
        if resumed_step is not None:
            drop_metrics_after(paths.metrics, resumed_step)
        self.logger = StatsLogger(config.stats_logger, paths, experiment=config.experiment_name,
                                  trial=config.trial_name)
        self.saver = Saver(config.saver.freq_steps, config.saver.freq_epochs, config.saver.freq_secs,
                           time.monotonic())
        self.recover_saver = Saver(config.recover.freq_steps, config.recover.freq_epochs, config.recover.freq_secs,
                                   time.monotonic())

    def resumed_in_epoch(self, epoch: int) -> None:
        """Resuming after a step of `epoch`: freq_epochs counts from there (else the first resumed step would save)."""
        self.saver.last_epoch = self.recover_saver.last_epoch = epoch

    def saves_due(self, step: int, epoch: int) -> list[str]:
        """The saver checkpoints to write after `step` (names under checkpoints/): the full weights are gathered for
        them on these steps only."""
        names = [f"step{step}"] if self.saver.due(step, epoch, time.monotonic()) else []
        return [*names, "final"] if step == self.steps else names

    def checkpoint_decision(self, step: int, epoch: int, requested: int | None, failing: bool
                            ) -> tuple[bool, int | None]:
        """(write a recover checkpoint now?, exit code to stop with after it or None)."""
        if failing:
            return False, EXIT_FAILING  # the loop checkpoints (save_before_failing) and fails
        if self.config.recover.mode == "disabled":
            return False, (EXIT_STOPPED if requested == EXIT_STOPPED else None)
        due = self.recover_saver.due(step, epoch, time.monotonic())
        if step == self.steps:
            return False, None  # finished: checkpoints/final is the result, nothing to resume
        return due or requested is not None, requested

    def write_recover(self, tmp: Path, state: recover.LoopState, started: float,
                      digests: dict[str, recover.FileDigest]) -> None:
        """After every rank wrote its shards into `tmp`: the loop state, manifest, rename, prune."""
        if fault_point("disk_full", state.step):  # tests: the disk fills up under rank 0 while the others wait
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp / recover.STATE))
        (tmp / recover.STATE).write_text(state.to_json())
        root = recover.recover_root(self.paths.root)
        final = recover.checkpoint_dir(root, state.step)
        recover.seal(tmp, final, digests)  # replaces a same-step one (resumed from an older one) only once sealed
        recover.prune(root, self.config.recover.keep_last)
        print(f"rlkit train: recover checkpoint of step {state.step} in {final} ({time.monotonic() - started:.2f} s)",
              flush=True)

    def export(self, state: dict[str, Any], name: str,
               write: Callable[[dict[str, Any], Path], None] | None = None) -> None:
        """The trained model (`actor`) as a Hugging Face checkpoint under checkpoints/`name`: by the algorithm's
        `write` when it has one, else as a causal LM with actor.path's config and the tokenizer the job used
        (tokenizer_path, else actor.path's; with LoRA, the adapter merged into the base, and the peft adapter itself
        in its `adapter/` subdirectory)."""
        from rlkit.models.dtypes import DTYPES
        from rlkit.weights import hf_export

        out_dir = self.paths.checkpoints / name
        actor = self.config.actor
        also_write: Callable[[Path], object] | None = None
        if actor.use_lora:  # a model on its own (a server's --model, a next stage's actor.path), its adapter beside
            from rlkit.trainer.lora import ADAPTER_DIR, adapter_state, merge_adapter_state
            from rlkit.weights.adapter_files import write_adapter

            adapter = adapter_state(state)
            state = merge_adapter_state(state, actor)

            def also_write(directory: Path) -> object:
                return write_adapter(adapter, actor, actor.path, directory / ADAPTER_DIR)
        # a resume from an older recover checkpoint reaches this step again: the new save replaces the old one
        if write is not None:
            write(state, out_dir)
        else:
            tokenizer = Path(self.config.tokenizer_path) if self.config.tokenizer_path else None
            hf_export.write_weights(state, Path(actor.path), out_dir, dtype=DTYPES[actor.dtype], replace=True,
                                    tokenizer_dir=tokenizer, also_write=also_write)
        print(f"rlkit train: saved {out_dir}", flush=True)

    def progress(self, step: int, status: str, fields: dict[str, Any]) -> None:
        """progress.json for `rlkit status`, then step_state for the job script (its step and status)."""
        write_atomic(self.paths.progress, json.dumps({
            "status": status, "step": step, "total_steps": self.steps, **fields, "updated": time.time(),
        }, indent=1))
        write_atomic(self.paths.step_state, step_state_text(step, status))
