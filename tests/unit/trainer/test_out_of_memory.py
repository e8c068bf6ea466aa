"""A trainer rank out of memory, through the real loop (rlkit.trainer.loop) and a real engine step of the tiny model
on one gloo rank: the model's forward or backward raises torch's own
OutOfMemoryError (or the CPU allocator's real error) through a patched MLP; the loop turns it into OutOfMemory (fatal:
exit code NO_RETRY_EXIT, never retried), whose message says where, how big the micro-batch was and which keys to turn
with their values; every other error passes untouched. And skipped optimizer steps as a metric, through the same
loop."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import Tensor

from rlkit.config.schema.actor import ActorConfig, MicroBatchSpec
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.errors import NO_RETRY_EXIT, StepError
from rlkit.trainer import out_of_memory
from rlkit.trainer.actor import PPOActor
from rlkit.trainer.engine import TrainEngine
from rlkit.trainer.loop import Loop, StepResult
from rlkit.trainer.out_of_memory import OutOfMemory
from rlkit.trials.paths import TrialPaths
from rlkit.types import Sample

CUDA_TEXT = "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79.10 GiB"
SAID = "CUDA out of memory. Tried to allocate 2.00 GiB"  # torch's words, cut after their first two sentences
LENGTHS = [12, 9, 7]  # one packed micro-batch of 28 tokens, the longest 12


class OneActor:
    """The loop's Algorithm around a real PPOActor: each step trains the same batch (after recomputing its log-probs
    without gradient, as grpo does, when `recompute`)."""

    def __init__(self, actor: PPOActor, samples: list[Sample], *, recompute: bool = False, steps: int = 1) -> None:
        self.actor, self.samples, self.recompute = actor, samples, recompute
        self.engines: dict[str, TrainEngine] = {"actor": actor.engine}
        self.total_steps = steps

    def start(self, resumed: dict[str, Any] | None) -> None: ...

    def step(self, step: int) -> StepResult:
        old = self.actor.logprobs_at(self.samples) if self.recompute else None
        return StepResult(self.actor.train_step(self.samples, old, None))

    def epoch(self, step: int) -> int:
        return 0

    def state(self, step: int) -> dict[str, Any]:
        return {}

    def progress(self) -> dict[str, Any]:
        return {}

    def summary(self, metrics: dict[str, float]) -> str:
        return ""

    def finish(self) -> None: ...

    def abort(self, exc: BaseException) -> None: ...

    def close(self) -> None: ...


def sample(length: int, group: int) -> Sample:
    completion = list(range(20, 20 + length - 3))
    return Sample([1, 2, 3], completion, [-1.0] * len(completion), 1.0, 0, True, group, advantage=0.5 - group)


@pytest.fixture
def one_rank() -> Iterator[None]:
    """A one-process gloo group (FSDP needs one); the loop destroys it as it ends."""
    from rlkit.servers.health import find_free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{find_free_port()}", rank=0, world_size=1)
    yield
    if dist.is_initialized():
        dist.destroy_process_group()
    out_of_memory.done()


def actor_config(model_dir: Path, *, packing: bool = True, minibatches: int = 1) -> ActorConfig:
    return ActorConfig(path=str(model_dir), dtype="float32", gradient_checkpointing=False, attn_impl="sdpa",
                       logprob_chunk_tokens=16, ppo_n_minibatches=minibatches, group_size=1,
                       mb_spec=MicroBatchSpec(max_tokens_per_mb=64, packing=packing))


def run_loop(tmp_path: Path, actor_cfg: ActorConfig, patch: Callable[[torch.nn.Module], None], *,
             recompute: bool = False, steps: int = 1, lengths: list[int] = LENGTHS) -> Path:
    """Build the engine, patch its second layer's MLP, run the loop; returns the trial directory."""
    config = ExperimentConfig(experiment_name="e", trial_name="t", type="grpo", allocation_mode="vllm:d1+fsdp:d2",
                              actor=actor_cfg)
    config.recover.mode, config.recover.freq_secs = "disabled", None
    actor = PPOActor.build(actor_cfg, rank=0, world=1, device=torch.device("cpu"), pad_id=0, temperature=1.0,
                           total_optimizer_steps=10)
    patch(actor.engine.model.model.layers[1].mlp)
    samples = [sample(n, i) for i, n in enumerate(lengths)]
    algorithm = OneActor(actor, samples, recompute=recompute, steps=steps)
    stop = SimpleNamespace(requested=None)
    Loop(config, TrialPaths(tmp_path), algorithm, None, rank0=True, stop=stop).run()  # type: ignore[arg-type]
    return tmp_path


def raising(error: Callable[[], BaseException], *, grad: bool | None = True) -> Callable[[torch.nn.Module], None]:
    """A patch: the MLP's forward raises `error()` (only with gradient on, `grad` True; only without, False)."""
    def patch(mlp: torch.nn.Module) -> None:
        own = mlp.forward

        def forward(x: Tensor) -> Tensor:
            if grad is None or torch.is_grad_enabled() == grad:
                raise error()
            return own(x)

        mlp.forward = forward  # type: ignore[method-assign]
    return patch


def progress(trial: Path) -> str:
    return str(json.loads((trial / "progress.json").read_text())["status"])


KNOBS = ["actor.mb_spec.max_tokens_per_mb=64", "actor.gradient_checkpointing=false", "actor.logprob_chunk_tokens=16",
         "actor.fsdp.ulysses_sp_size=1", "allocation_mode=vllm:d1+fsdp:d2"]


@pytest.mark.parametrize("packing", [True, False], ids=["packed", "padded"])
def test_out_of_memory_in_the_forward_is_fatal_and_names_the_keys(one_rank: None, tiny_model_dir: Path,
                                                                  tmp_path: Path, packing: bool) -> None:
    with pytest.raises(OutOfMemory) as caught:
        run_loop(tmp_path, actor_config(tiny_model_dir, packing=packing),
                 raising(lambda: torch.OutOfMemoryError(CUDA_TEXT)))
    error = caught.value
    assert error.exit_code == NO_RETRY_EXIT and not error.retry_reason
    assert isinstance(error.__cause__, torch.OutOfMemoryError)
    message = str(error)
    assert message.startswith("out of GPU memory at step 1, in the actor's forward, on trainer rank 0")
    batch = ("3 sequences packed, 28 tokens, the longest 12" if packing
             else "3 sequences, 28 tokens (36 with padding), the longest 12")
    assert f"micro-batch: {batch}" in message
    assert f"memory: {SAID}" in message
    # what the micro-batch counted against max_tokens_per_mb: packed, its tokens; padded, 3 rows x the longest
    assert f"max_tokens_per_mb=64: fewer tokens per micro-batch, e.g. {14 if packing else 18} " in message
    for knob in KNOBS:
        assert f"    {knob}: " in message, knob
    assert "not retried" in message
    assert progress(tmp_path).startswith("failed: out of GPU memory at step 1, in the actor's forward")


def test_out_of_memory_in_the_backward(one_rank: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    class FailsInBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx: Any, x: Tensor) -> Tensor:
            return x.clone()

        @staticmethod
        def backward(ctx: Any, grad: Tensor) -> Tensor:
            raise torch.OutOfMemoryError(CUDA_TEXT)

    def patch(mlp: torch.nn.Module) -> None:
        own = mlp.forward
        mlp.forward = lambda x: FailsInBackward.apply(own(x))  # type: ignore[method-assign]

    with pytest.raises(OutOfMemory, match="at step 1, in the actor's backward") as caught:
        run_loop(tmp_path, actor_config(tiny_model_dir), patch)
    assert "micro-batch: 3 sequences packed, 28 tokens, the longest 12" in str(caught.value)


def test_out_of_memory_in_the_log_prob_recompute(one_rank: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(OutOfMemory, match="at step 1, in the actor's forward without gradient"):
        run_loop(tmp_path, actor_config(tiny_model_dir), raising(lambda: torch.OutOfMemoryError(CUDA_TEXT), grad=False),
                 recompute=True)


def test_out_of_memory_as_the_algorithm_starts(one_rank: None, tiny_model_dir: Path, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """grpo's start pushes the weights (and probes them) before step 1: the same error, not a retried crash."""
    def start(self: OneActor, resumed: dict[str, Any] | None) -> None:
        raise torch.OutOfMemoryError(CUDA_TEXT)

    monkeypatch.setattr(OneActor, "start", start)
    with pytest.raises(OutOfMemory, match="at step 1, outside a model's forward or backward"):
        run_loop(tmp_path, actor_config(tiny_model_dir), lambda mlp: None)


def test_the_cpu_allocators_own_failure_is_out_of_cpu_memory(one_rank: None, tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    def allocate() -> BaseException:
        try:
            torch.empty(1 << 62, dtype=torch.uint8)  # the installed torch's own words, whatever they are
        except RuntimeError as exc:
            return exc
        raise AssertionError("2**62 bytes were allocated")

    with pytest.raises(OutOfMemory) as caught:
        run_loop(tmp_path, actor_config(tiny_model_dir), raising(allocate))
    message = str(caught.value)
    assert message.startswith("out of CPU memory at step 1, in the actor's forward")
    assert "DefaultCPUAllocator" in message
    assert "    launcher.trainer_mem_per_gpu=32768: " in message


def test_other_runtime_errors_pass_untouched(one_rank: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    error = RuntimeError("mat1 and mat2 shapes cannot be multiplied (28x128 and 64x256)")
    with pytest.raises(RuntimeError) as caught:
        run_loop(tmp_path, actor_config(tiny_model_dir), raising(lambda: error))
    assert caught.value is error and not isinstance(caught.value, OutOfMemory)
    assert progress(tmp_path) == "failed: RuntimeError"


def test_a_servers_out_of_memory_quoted_by_rlkit_is_not_the_trainers(one_rank: None, tiny_model_dir: Path,
                                                                       tmp_path: Path) -> None:
    """rlkit's own errors quote the servers' answers: a server out of memory on a weight push is the server's."""
    error = StepError(f'servers/0: /update_weights answered HTTP 500: {{"error": "{CUDA_TEXT}"}}')
    with pytest.raises(StepError) as caught:
        run_loop(tmp_path, actor_config(tiny_model_dir), raising(lambda: error))
    assert caught.value is error and not isinstance(caught.value, OutOfMemory)
    assert out_of_memory.memory_kind(StepError("x")) is None
    assert out_of_memory.memory_kind(RuntimeError(CUDA_TEXT)) == "GPU"  # torch's CUDA runtime errors are plain


# torch's CUDA allocator's message (c10/cuda/CUDACachingAllocator.cpp's format), with the figures to fill in
TORCH_OOM = ("CUDA out of memory. Tried to allocate {tried}. GPU 0 has a total capacity of 79.19 GiB of which {free} "
             "is free.{others} Including non-PyTorch memory, this process has {own} memory in use. Of the allocated "
             "memory 70.00 GiB is allocated by PyTorch, and {reserved} is reserved by PyTorch but unallocated. If "
             "reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
             "to avoid fragmentation.")


@pytest.mark.parametrize(("figures", "retried"), [
    ({"tried": "2.00 GiB", "free": "0 bytes", "others": "", "own": "79.19 GiB", "reserved": "120.00 MiB"}, ""),
    ({"tried": "2.00 GiB", "free": "1.06 GiB", "others": " Process 4242 has 30.00 GiB memory in use.",
      "own": "48.13 GiB", "reserved": "120.00 MiB"}, "other processes held 30.0 GiB of the GPU's 79.2 GiB"),
    ({"tried": "2.00 GiB", "free": "3.56 MiB", "others": "", "own": "79.18 GiB", "reserved": "9.18 GiB"},
     "fragmentation"),
])
def test_a_restart_is_kept_for_what_a_restart_fixes(figures: dict[str, str], retried: str) -> None:
    """This rank's own memory: fatal. Another process's memory, or a fragmented allocator: retried, said why."""
    config = ExperimentConfig(experiment_name="e", trial_name="t", type="grpo", allocation_mode="vllm:d1+fsdp:d2")
    error = out_of_memory.out_of_memory(torch.OutOfMemoryError(TORCH_OOM.format(**figures)), "GPU", config, 2,
                                        {"actor": object()})
    assert (error.exit_code == 1) == bool(retried) and (error.exit_code == NO_RETRY_EXIT) == (not retried)
    assert retried in error.retry_reason and (f"  retried: {error.retry_reason}" in str(error)) == bool(retried)
    if retried == "fragmentation":
        assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in str(error)


def test_the_critics_keys_and_the_exit_code(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
                                            ) -> None:
    """An engine named critic gets the critic's keys (no log-prob chunks); `rlkit train` exits NO_RETRY_EXIT with the
    message, which the job script never retries."""
    import rlkit.cli.main as cli

    config = ExperimentConfig(experiment_name="e", trial_name="t", type="ppo", allocation_mode="fsdp:d8")
    config.critic.mb_spec.max_tokens_per_mb, config.critic.gradient_checkpointing = 4096, True
    actor, critic = object(), object()
    out_of_memory.now(critic, out_of_memory.OPTIMIZER)
    error = out_of_memory.out_of_memory(torch.OutOfMemoryError(CUDA_TEXT), "GPU", config, 7,
                                        {"actor": actor, "critic": critic})
    message = str(error)
    assert message.startswith("out of GPU memory at step 7, in the critic's optimizer step")
    assert "    critic.mb_spec.max_tokens_per_mb=4096: " in message
    assert "    critic.gradient_checkpointing=true: " in message
    assert "logprob_chunk_tokens" not in message and "micro-batch:" not in message

    def app(**_kwargs: Any) -> None:
        raise error

    monkeypatch.setattr(cli, "app", app)
    with pytest.raises(SystemExit) as ended:
        cli.main()
    assert ended.value.code == NO_RETRY_EXIT
    assert "out of GPU memory at step 7" in capsys.readouterr().err


def test_where_it_ran_out_decides_what_is_said() -> None:
    config = ExperimentConfig(experiment_name="e", trial_name="t", type="grpo", allocation_mode="vllm:d1+fsdp:d2")
    engine = object()

    def said(step: int | None) -> str:
        return str(out_of_memory.out_of_memory(torch.OutOfMemoryError(CUDA_TEXT), "GPU", config, step,
                                               {"actor": engine}))

    out_of_memory.now(engine, out_of_memory.OPTIMIZER)  # a record left from a step: loading the model is not it
    building = said(None)
    assert building.startswith("out of GPU memory while building the trainer")
    assert "its share of the float32 weights" in building and "keys that lower it" not in building
    assert "    allocation_mode=vllm:d1+fsdp:d2: more trainer GPUs" in building
    push = said(3)  # nothing noted: between the optimizer step and the next forward
    assert push.startswith("out of GPU memory at step 3, outside a model's forward or backward")
    assert "    actor.weight_chunked_mem_mb=1024: " in push and "micro-batch:" not in push
    out_of_memory.LAST.run = out_of_memory.Pass(out_of_memory.REFERENCE, out_of_memory.NO_GRAD, {
        "input_ids": torch.zeros(1, 9), "position_ids": torch.arange(9)[None]})
    reference = said(4)
    assert reference.startswith("out of GPU memory at step 4, in the reference model's forward without gradient")
    assert "micro-batch: 1 sequence packed, 9 tokens, the longest 9" in reference
    assert "actor.mb_spec.max_tokens_per_mb=null: lowering it cannot help here: the micro-batch was one sequence" \
        in reference and "    actor.logprob_chunk_tokens=1024: " in reference


@pytest.mark.parametrize("inputs, expected", [
    ({"input_ids": torch.zeros(2, 5), "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])},
     "2 sequences, 8 tokens (10 with padding), the longest 5"),
    ({"input_ids": torch.zeros(1, 9), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0, 1]])},
     "3 sequences packed, 9 tokens, the longest 4"),
    ({"input_ids": torch.zeros(4, 6)}, "4 sequences, 24 tokens, the longest 6"),
])
def test_micro_batch_figures(inputs: dict[str, Tensor], expected: str) -> None:
    batch = out_of_memory.figures(inputs)
    assert batch is not None and out_of_memory.describe(batch) == expected


def test_skipped_optimizer_steps_are_a_metric(one_rank: None, tiny_model_dir: Path, tmp_path: Path) -> None:
    """A NaN loss at step 1 skips both of its optimizer steps: actor/skipped_steps 2 in metrics.jsonl (where the NaN
    gradient norm itself is null), 0 at step 2."""
    def patch(mlp: torch.nn.Module) -> None:
        own, calls = mlp.forward, [0]

        def forward(x: Tensor) -> Tensor:
            calls[0] += torch.is_grad_enabled()  # training forwards: step 1's are one per minibatch
            return own(x) * (torch.nan if torch.is_grad_enabled() and calls[0] <= 2 else 1.0)

        mlp.forward = forward  # type: ignore[method-assign]

    run_loop(tmp_path, actor_config(tiny_model_dir, minibatches=2), patch, steps=2, lengths=[12, 9, 7, 8])
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert records[0]["actor/grad_norm"] is None and records[0]["actor/skipped_steps"] == 2
    assert records[1]["actor/grad_norm"] is not None and records[1]["actor/skipped_steps"] == 0
