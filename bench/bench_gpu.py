"""The GPU checklist (../shared/GPU-CHECKLIST.md, items 1-4) in one command, through the trainer's own code.

Run: `python bench/bench_gpu.py --out DIR` on a machine with one CUDA GPU (`--shape tiny` runs the same code on the
CPU with gloo, to check the script itself). A world of one rank joins NCCL (gloo without CUDA), as
`rlkit.trainer.dist.init_distributed` does in a job; the model has Qwen2.5-1.5B's shapes with random weights (no
network on the GPU machine), saved once as a bf16 HF directory that every engine loads as a job would.

  1. one optimizer step of each job type's loss on rlkit's TrainEngine (FSDP2, bf16 compute, float32 master
     weights, sdpa): grpo's actor, ppo's critic, sft, rw, dpo (frozen reference), grpo with LoRA; loss and gradient
     norm must be finite
  2. throughput of the grpo actor's step at sequence lengths 1k and 4k, with and without gradient checkpointing:
     tokens/s and MFU = 6 x parameters x tokens/s over the bf16 matrix rate measured first in the same run
     (attention's own FLOPs not counted, so MFU understates long sequences a little)
  3. numerics: the weight fingerprint (log-probs of a probe sequence) from the trainer's sharded bf16 forward vs the
     bf16 HF export loaded as a server loads it, the spread actor.weight_check_tolerance must allow
  4. checkpoints: engine.save_sharded / load_sharded (model + AdamW states) against the floor of writing (fsync)
     and reading the same bytes as one safetensors file; the HF export's bytes and time
  5. real sequence lengths (the checklist's next item 1, issue 46 part 6; `--only long` runs it alone): the same
     step at 8k and 32k tokens a sequence, packed with the head's log-probs in chunks (the actor's defaults), with
     and without gradient checkpointing, against the 1k/4k figures of 2; then the same 8k step with the full
     logits (actor.logprob_chunk_tokens=0) for the head's share of the peak; `--shape qwen2.5-3b` / `qwen2.5-7b`
     are the checklist's bigger models on one GPU
Writes DIR/gpu.json and prints one line per figure. A step that fails (out of memory, say) is recorded, not fatal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # before transformers is imported: no progress bars
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

from gpu_steps import PAD, actor_config, free, grpo_step, peak_gb, samples, sync, timed  # noqa: E402  (bench/)
from gpu_throughput import long_sequences, throughput  # noqa: E402

HEAD_SCALE = 5.0  # the random embedding (tied head) times this: peaked next-token distributions like a trained LM's

# Qwen2.5-1.5B's config.json shapes (tied embeddings); tiny: the same architecture small enough for the CPU
SHAPES: dict[str, dict[str, Any]] = {
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                         tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    # the checklist's "bigger model on one GPU" (config.json shapes of the released checkpoints)
    "qwen2.5-3b": dict(hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
                       num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768,
                       tie_word_embeddings=True, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, max_position_embeddings=32768,
                       tie_word_embeddings=False, rope_theta=1000000.0, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=512, max_position_embeddings=8192, tie_word_embeddings=True),
}


def matmul_tflops(device: Any, n: int) -> float:
    """bf16 n x n x n matrix products per second (3 warm-ups, mean of 10), in TFLOP/s."""
    import torch

    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(device)
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(device)
    return 2 * n**3 * 10 / (time.perf_counter() - started) / 1e12


def write_model(out: Path, shape: dict[str, Any], device: Any) -> tuple[Path, int]:
    """A random-weight Qwen2 of `shape` saved in bf16 (as a released checkpoint is); returns it and its parameters."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    config = Qwen2Config(**shape, architectures=["Qwen2ForCausalLM"])
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():  # at init's std 0.02 every logit is near 0 and the fingerprint compares near-uniform rows
        model.get_input_embeddings().weight.mul_(HEAD_SCALE)
        if not shape.get("tie_word_embeddings", True):  # an untied head (7B) scaled alike
            model.get_output_embeddings().weight.mul_(HEAD_SCALE)
    n_params = sum(p.numel() for p in model.parameters())  # a tied head counts once
    model.save_pretrained(out)
    del model
    return out, n_params


def algorithm_steps(model: Path, vocab: int, length: int, device: Any) -> dict[str, Any]:
    """Item 1: one step of each job type's loss; each entry holds its loss, gradient norm, seconds and peak GB."""
    import torch

    from rlkit.config.schema.critic import CriticConfig
    from rlkit.jobs.pairs.data import Pair
    from rlkit.jobs.pairs.loss_fns import DPOLoss, fill_reference, rw_loss_fn
    from rlkit.jobs.pairs.losses import ReferenceLogps
    from rlkit.jobs.pairs.steps import CountedLoss, micro_batches
    from rlkit.jobs.ppo.critic import PPOCritic
    from rlkit.jobs.sft.data import SFTExample
    from rlkit.jobs.sft.loss import collate, sft_loss_fn
    from rlkit.trainer.actor import PPOActor
    from rlkit.trainer.engine import TrainEngine, causal_lm, value_head_model
    from rlkit.trainer.reference import ReferenceLoad, frozen_reference

    half = length // 2
    g = torch.Generator().manual_seed(1)
    rand = lambda n: torch.randint(1, vocab, (n,), generator=g).tolist()  # noqa: E731
    pairs = [Pair(i, tuple(rand(half)), tuple(rand(half)), tuple(rand(half))) for i in range(4)]
    spec = actor_config(model).mb_spec

    def grpo(lora: bool) -> Callable[[], dict[str, float]]:
        def run() -> dict[str, float]:
            actor = PPOActor.build(actor_config(model, lora=lora), rank=0, world=1, device=device, pad_id=PAD,
                                   temperature=1.0, total_optimizer_steps=10)
            return {k: v for k, v in grpo_step(actor, samples(8, half, half, vocab, 2)).items()
                    if k in ("actor/loss", "actor/grad_norm", "actor/entropy")}
        return run

    def ppo_critic() -> dict[str, float]:
        critic = PPOCritic.build(CriticConfig(path=str(model), attn_impl="sdpa", ppo_n_minibatches=1),
                                 actor_config(model), rank=0, world=1, device=device, pad_id=PAD,
                                 total_optimizer_steps=10)
        batch = samples(8, half, half, vocab, 3)
        values = critic.values_at(batch)
        returns = [[s.reward] * len(s.completion_ids) for s in batch]
        out = critic.train_step(batch, values, returns)
        return {k: out[k] for k in ("critic/value_loss", "critic/grad_norm")}

    def sft() -> dict[str, float]:
        engine = TrainEngine(actor_config(model), rank=0, world=1, device=device, total_optimizer_steps=10,
                             model_factory=causal_lm)
        rows = [SFTExample(ids, [0] * half + [1] * (length - half)) for ids in (rand(length) for _ in range(4))]
        mbs = [collate(rows[i : i + 2], PAD).to(device) for i in (0, 2)]
        losses: list[float] = []

        def loss_fn(m: Any, mb: Any) -> tuple[Any, int]:
            nll, n, _ = sft_loss_fn(m, mb)
            losses.append(float(nll) / max(1, n))
            return nll / max(1, n), n

        out = engine.optimizer_step(mbs, loss_fn, sum(r.n_targets for r in rows))
        return {"sft/loss": sum(losses) / len(losses), "sft/grad_norm": out["grad_norm"]}

    def rw() -> dict[str, float]:
        engine = TrainEngine(actor_config(model), rank=0, world=1, device=device, total_optimizer_steps=10,
                             model_factory=value_head_model)
        loss = CountedLoss(rw_loss_fn)
        out = engine.optimizer_step(micro_batches(pairs, spec, PAD, pairs[0], device), loss, len(pairs))
        return {"rw/loss": loss.means.reduce(["loss"])["loss"], "rw/grad_norm": out["grad_norm"]}

    def dpo() -> dict[str, float]:
        engine = TrainEngine(actor_config(model), rank=0, world=1, device=device, total_optimizer_steps=10,
                             model_factory=causal_lm)
        reference = frozen_reference(ReferenceLoad(str(model), "bfloat16", "sdpa"), device)
        cache = ReferenceLogps()
        mbs = micro_batches(pairs, spec, PAD, pairs[0], device)
        for mb in mbs:
            fill_reference(reference, mb.batch, cache)
        loss = CountedLoss(DPOLoss(cache, beta=0.1))
        out = engine.optimizer_step(mbs, loss, len(pairs))
        return {"dpo/loss": loss.means.reduce(["loss"])["loss"], "dpo/grad_norm": out["grad_norm"]}

    jobs: dict[str, Callable[[], dict[str, float]]] = {"grpo": grpo(False), "ppo_critic": ppo_critic, "sft": sft,
                                                       "rw": rw, "dpo": dpo, "grpo_lora": grpo(True)}
    results: dict[str, Any] = {}
    for name, run in jobs.items():
        free(device)
        try:
            figures, seconds = timed(run, device)
            finite = all(v == v and abs(v) != float("inf") for v in figures.values())
            results[name] = {"ok": finite, "seconds_build_and_step": round(seconds, 2), "peak_gb": peak_gb(device),
                             **figures}
        except Exception as e:  # recorded: the other steps still run
            results[name] = {"ok": False, "error": f"{type(e).__name__}: {e}"[:2000],
                             "trace": traceback.format_exc()[-3000:]}
        print(f"step {name}: {json.dumps(results[name])[:600]}", flush=True)
    return results


def numerics_and_checkpoints(model: Path, vocab: int, work: Path, device: Any, *, skip_checkpoint: bool = False
                             ) -> dict[str, Any]:
    """Items 3 and 4 on one engine after one grpo step."""
    import torch
    from floor_tensors import checkpoint_tensors
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from rlkit.trainer.actor import PPOActor
    from rlkit.weights.fingerprint import trainer_probe_logprobs
    from rlkit.weights.hf_export import write_weights

    free(device)
    actor = PPOActor.build(actor_config(model), rank=0, world=1, device=device, pad_id=PAD, temperature=1.0,
                           total_optimizer_steps=10)
    engine = actor.engine
    grpo_step(actor, samples(4, 64, 64, vocab, 6))
    export, export_s = timed(lambda: write_weights(engine.full_state_dict(), model, work / "export", torch.bfloat16),
                             device)
    export_bytes = sum(f.stat().st_size for f in export.glob("*.safetensors"))
    out: dict[str, Any] = {"hf_export": {"seconds": round(export_s, 2), "bytes": export_bytes}}
    served = {dtype: AutoModelForCausalLM.from_pretrained(export, dtype=getattr(torch, dtype),
                                                          attn_implementation="sdpa").to(device)
              for dtype in ("bfloat16", "float32")}  # how a server would load the export: its --dtype
    start = torch.randint(1, vocab, (1, 16), generator=torch.Generator().manual_seed(7)).to(device)
    torch.manual_seed(7)
    probes = {"random_tokens": torch.randint(1, vocab, (256,), generator=torch.Generator().manual_seed(8)).tolist(),
              "model_sampled": served["float32"].generate(start, do_sample=True, temperature=1.0, top_k=0,
                                                          max_new_tokens=240, min_new_tokens=240,
                                                          pad_token_id=PAD)[0].tolist()}
    for probe_name, probe in probes.items():
        trainer_lp = engine.probe_logprobs(probe)
        for dtype, served_model in served.items():
            served_lp = trainer_probe_logprobs(served_model, probe)
            diffs = [abs(a - b) for a, b in zip(served_lp, trainer_lp, strict=True)]
            key = f"fingerprint_{probe_name}_served_{dtype}"
            out[key] = {"mean_abs": sum(diffs) / len(diffs), "max_abs": max(diffs),
                        "mean_logprob": sum(trainer_lp) / len(trainer_lp)}
            print(f"{key}: {out[key]}", flush=True)
    del served
    free(device)
    if skip_checkpoint:
        return out
    shutil.rmtree(export)  # the disk holds the checkpoint and its floor next
    ckpt = work / "ckpt"
    digests, save_s = timed(lambda: engine.save_sharded(ckpt), device)
    os.sync()
    _, load_s = timed(lambda: engine.load_sharded(ckpt, 1, digests), device)  # checksums checked as it reads
    flat = checkpoint_tensors(engine)
    floor = work / "floor.safetensors"
    started = time.perf_counter()
    save_file(flat, str(floor))
    with open(floor, "rb") as f:
        os.fsync(f.fileno())
    floor_w = time.perf_counter() - started
    started = time.perf_counter()
    with open(floor, "rb") as f:
        while f.read(1 << 24):
            pass
    floor_r = time.perf_counter() - started
    floor.unlink()
    shutil.rmtree(ckpt)
    ckpt_bytes = sum(d.size for d in digests.values())
    out["checkpoint"] = {"bytes": ckpt_bytes, "save_s": round(save_s, 2), "load_s": round(load_s, 2),
                         "floor_write_s": round(floor_w, 2), "floor_read_s": round(floor_r, 2),
                         "save_over_floor": round(save_s / floor_w, 2), "load_over_floor": round(load_s / floor_r, 2)}
    print(f"checkpoint: {out['checkpoint']}", flush=True)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-1.5b")
    sections = ["steps", "throughput", "numerics", "checkpoint", "long"]
    parser.add_argument("--skip", nargs="*", default=[], choices=sections)
    parser.add_argument("--only", nargs="*", default=[], choices=sections,
                        help="run these sections alone (the others skipped)")
    args = parser.parse_args()
    if args.only:
        args.skip = [name for name in sections if name not in args.only]
    import torch
    import transformers

    from rlkit.servers.health import find_free_port
    from rlkit.trainer.dist import init_distributed

    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(find_free_port()))
    args.out.mkdir(parents=True, exist_ok=True)
    work = Path(os.environ.get("RLKIT_BENCH_DIR", args.out)) / "bench-gpu-work"
    work.mkdir(parents=True, exist_ok=True)
    _env, device = init_distributed()
    tiny = args.shape == "tiny"
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "backend": torch.distributed.get_backend(), "torch": torch.__version__,
        "transformers": transformers.__version__, "shape": args.shape}
    report["bf16_matmul_tflops"] = matmul_tflops(device, 512 if tiny else 8192)
    print(f"device {report['device']} ({report['backend']}), bf16 matmul {report['bf16_matmul_tflops']:.4g} TFLOP/s",
          flush=True)
    model, n_params = write_model(work / "model", SHAPES[args.shape], device)
    report["parameters"] = n_params
    vocab = SHAPES[args.shape]["vocab_size"]
    length = 256 if tiny else 1024

    def section(name: str, fn: Callable[[], Any]) -> None:
        try:
            report[name] = fn()
        except Exception as e:
            report[name] = {"error": f"{type(e).__name__}: {e}"[:2000], "trace": traceback.format_exc()[-3000:]}
            print(f"{name} failed: {report[name]['error']}", flush=True)
        (args.out / "gpu.json").write_text(json.dumps(report, indent=1))

    if "steps" not in args.skip:
        section("steps", lambda: algorithm_steps(model, vocab, length, device))
    if "throughput" not in args.skip:
        section("throughput", lambda: throughput(model, vocab, n_params, report["bf16_matmul_tflops"],
                                                 [256, 1024] if tiny else [1024, 4096], 1024 if tiny else 16384,
                                                 device))
    if "long" not in args.skip:
        section("long", lambda: long_sequences(model, vocab, n_params, report["bf16_matmul_tflops"], tiny, device))
    if "numerics" not in args.skip:
        section("numerics", lambda: numerics_and_checkpoints(model, vocab, work, device,
                                                            skip_checkpoint="checkpoint" in args.skip))
    steps = report.get("steps", {})
    failed = [k for k, v in steps.items() if not v.get("ok")] if isinstance(steps, dict) else ["steps"]
    print(f"bench_gpu: {len(steps) - len(failed)} of {len(steps)} job types stepped; failed: {failed or 'none'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
