"""The CPU examples `rlkit demo NAME` runs on the dev cluster: each one's config in configs/, the files it needs in
the demo directory (built here, idempotently, so no example needs a step from its YAML comments), and the figures
its run is judged by (the same ones the suite asserts on).

Every example reads its model and data from `$RLKIT_DEMO_DIR` (`rlkit demo`: /tmp/rlkit-demo-<user>) and names its
trial after `$RLKIT_DEMO_TRIAL`, so one directory serves them all.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Metrics = list[dict[str, Any]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _reward(metrics: Metrics) -> str:
    first, last = [m["reward/mean"] for m in metrics[:3]], [m["reward/mean"] for m in metrics[-3:]]
    return (f"{len(metrics)} steps; mean reward of the first 3 steps {_mean(first):.3f}, "
            f"of the last 3 steps {_mean(last):.3f}")


def _distill(metrics: Metrics) -> str:
    """The logged reward (never trained on) and the per-token reverse KL to the teacher, first and last 3 steps."""
    kl = [float(m["distill/reverse_kl"]) for m in metrics if "distill/reverse_kl" in m]
    shown = f"; reverse KL to the teacher {_mean(kl[:3]):.3f} -> {_mean(kl[-3:]):.3f} nats/token" if kl else ""
    return _reward(metrics) + shown


def _tasks(metrics: Metrics) -> str:
    """The reward, and each reasoning-gym task's own mean score (reward/task/<task>/mean), first and last 3 steps."""
    tasks = sorted({k for m in metrics for k in m if k.startswith("reward/task/")})
    shown = [f"{k.split('/')[2]} {_mean(_evals(metrics, k)[:3]):.3f} -> {_mean(_evals(metrics, k)[-3:]):.3f}"
             for k in tasks]
    return _reward(metrics) + (f"; task scores {', '.join(shown)}" if shown else "")


def _evals(metrics: Metrics, key: str) -> list[float]:
    return [float(m[key]) for m in metrics if key in m]


def _first_last(name: str, values: list[float]) -> str:
    """`name first -> last`; one evaluation (a run of one epoch: rw, dpo and sft evaluate at each epoch's end) is
    shown as one figure, not as a change from itself."""
    if len(values) == 1:
        return f"{name} {values[0]:.3f} (one evaluation, at the end)"
    return f"{name} {values[0]:.3f} -> {values[-1]:.3f}"


def _sft(metrics: Metrics) -> str:
    evals = _evals(metrics, "eval/loss")
    held_out = f"; {_first_last('held-out loss', evals)}" if evals else ""
    first, last = metrics[0]["sft/loss"], metrics[-1]["sft/loss"]
    return f"{len(metrics)} steps; training loss {first:.3f} -> {last:.3f}{held_out}"


def _pairs(metrics: Metrics) -> str:
    accuracy = _evals(metrics, "eval/accuracy")
    margin = _evals(metrics, "eval/reward_margin")
    shown = [_first_last("held-out accuracy", accuracy)] if accuracy else []
    shown += [_first_last("held-out reward margin", margin)] if margin else []
    return f"{len(metrics)} steps; " + ", ".join(shown or ["no evaluation recorded"])


def _by_stage(metrics: Metrics) -> str:
    """A staged run's stage, judged by what its job type logs."""
    return _reward(metrics) if "reward/mean" in metrics[0] else _sft(metrics)


def generate_report(trial_dir: Path) -> str:
    """A generate run's figures: how many prompts it completed, the first completion, and a scored run's summary
    (rlkit.jobs.generate.summary)."""
    from rlkit.cli.status import generated_headline

    completions = trial_dir / "completions.jsonl"
    rows = completions.read_text().splitlines() if completions.is_file() else []
    first = json.loads(rows[0]) if rows else {}
    text = (first.get("completions") or [{}])[0].get("text", "")
    scored = generated_headline(trial_dir / "summary.json")
    return (f"{len(rows)} prompts completed in {completions}"
            + (f"; the first: {first.get('prompt')!r} -> {text!r}" if rows else "")
            + (f"; scored: {scored}" if scored else ""))


# What each example needs in the demo directory: name -> how to build it there (idempotent).
def _tiny_model(directory: Path) -> None:
    from rlkit.models.tiny import build_tiny_model

    build_tiny_model(directory / "tiny-model")


def _tiny_model_lora(directory: Path) -> None:
    from rlkit.models.tiny import build_tiny_model

    build_tiny_model(directory / "tiny-model-lora", head_scale=4.0)  # why: configs/grpo-lora-cpu-demo.yaml


def _digits(directory: Path) -> None:
    from rlkit.tasks.digits import write_dataset

    write_dataset(directory / "digits.jsonl")


def _digits_teacher(directory: Path) -> None:
    from rlkit.models.tiny import build_tiny_model
    from rlkit.tasks.digits_teacher import build_digits_teacher

    build_digits_teacher(directory / "digits-teacher", build_tiny_model(directory / "tiny-model"))


def _sft_rows(directory: Path) -> None:
    from rlkit.tasks.digits_sft import write_sft_dataset

    write_sft_dataset(directory)


def _pair_rows(directory: Path) -> None:
    from rlkit.tasks.digits_pairs import write_pair_splits

    write_pair_splits(directory)


def _press_held_out(directory: Path) -> None:
    from rlkit.agent.press_door import write_held_out

    write_held_out(directory / "press-held-out.jsonl")


def _verifiers_tasks(directory: Path) -> None:
    """The tasks of configs/grpo-verifiers-cpu-demo.yaml: each row names a task of the rlkit_sums taskset by index."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "verifiers-tasks.jsonl").write_text("".join(json.dumps({"prompt": f"What is {i} + {i}?", "task": i})
                                                             + "\n" for i in range(8)))


def _prompts(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "prompts.jsonl").write_text("".join(json.dumps({"prompt": f"{i}+{i}=", "id": i}) + "\n"
                                                    for i in range(12)))


PREPARE: dict[str, Callable[[Path], None]] = {
    "tiny-model": _tiny_model, "tiny-model-lora": _tiny_model_lora, "digits": _digits,
    "digits-teacher": _digits_teacher, "sft-rows": _sft_rows, "pairs": _pair_rows, "prompts": _prompts,
    "press-held-out": _press_held_out, "verifiers-tasks": _verifiers_tasks,
}


@dataclass(frozen=True)
class Demo:
    name: str
    config: str  # under configs/
    summary: str
    needs: tuple[str, ...]  # keys of PREPARE
    report: Callable[[Metrics], str] | None  # the figures of a training run, from its metrics.jsonl


DEMOS: dict[str, Demo] = {d.name: d for d in (
    Demo("grpo", "grpo-cpu-demo.yaml", "asynchronous GRPO: 2 vLLM servers and 2 trainer ranks on 4 nodes",
         ("tiny-model", "digits"), _reward),
    Demo("one-node", "grpo-one-node-cpu-demo.yaml", "the same GRPO packed on one node, each step on its GPU slice",
         ("tiny-model", "digits"), _reward),
    Demo("ppo", "ppo-cpu-demo.yaml", "PPO with a critic", ("tiny-model", "digits"), _reward),
    Demo("lora", "grpo-lora-cpu-demo.yaml", "GRPO training LoRA adapters, served by vLLM's runtime LoRA",
         ("tiny-model-lora", "digits"), _reward),
    Demo("distill", "distill-cpu-demo.yaml", "on-policy distillation: the student learns the reverse KL to a teacher "
         "served as an auxiliary model, without a reward", ("tiny-model", "digits", "digits-teacher"), _distill),
    Demo("sft", "sft-cpu-demo.yaml", "supervised fine-tuning on 2 trainer ranks", ("tiny-model", "sft-rows"), _sft),
    Demo("rw", "rw-cpu-demo.yaml", "a reward model trained on preference pairs", ("tiny-model", "pairs"), _pairs),
    Demo("dpo", "dpo-cpu-demo.yaml", "DPO against a frozen reference", ("tiny-model", "pairs"), _pairs),
    Demo("stages", "sft-grpo-cpu-demo.yaml", "two stages: SFT, then GRPO from its model",
         ("tiny-model", "sft-rows", "digits"), _by_stage),
    Demo("opmd", "opmd-cpu-demo.yaml", "OPMD (Trinity-RFT's online policy mirror descent) on the GRPO demo's task",
         ("tiny-model", "digits"), _reward),
    Demo("mix", "grpo-mix-cpu-demo.yaml", "GRPO with an SFT+RL mix of expert rows, a weight push every 4 steps and a "
         "weighted two-function reward", ("tiny-model", "digits", "sft-rows"), _reward),
    Demo("generate", "generate-cpu-demo.yaml", "completions of a prompt file by 2 vLLM servers",
         ("tiny-model", "prompts"), None),
    Demo("agent", "grpo-agent-cpu-demo.yaml", "multi-turn GRPO: the model learns to call a tool in two turns, its "
         "episodes run by an unmodified agent program (the openai client) against rlkit's OpenAI-compatible endpoint",
         ("tiny-model", "digits", "press-held-out"), _reward),
    Demo("rgym", "grpo-rgym-cpu-demo.yaml", "GRPO on two reasoning-gym tasks by name, mixed, scored by their own "
         "score_answer (a format reward blended in: the random tiny model scores 0 on the tasks)", ("tiny-model",),
         _tasks),
    Demo("verifiers", "grpo-verifiers-cpu-demo.yaml", "GRPO on a verifiers environment's episodes (its own venv: "
         "bash scripts/verifiers-env.sh), trained token-exactly with the trace's reward",
         ("tiny-model", "verifiers-tasks"), _reward),
)}


def prepare(demo: Demo, directory: Path) -> None:
    """Build what `demo` reads in `directory` (each step reuses what is already there)."""
    for need in demo.needs:
        PREPARE[need](directory)

