"""`rlkit demo [NAME]` (and `bash scripts/demo.sh [NAME]`): one CPU example on the dev cluster, end to end, as a user
would run it: builds what it reads (rlkit.cli.demos), submits its config, follows the job, then shows the status,
the figures it is judged by (reward, loss, accuracy or margin; completions for generate), and where the metrics and
the trained model are. `--list` names the examples; grpo is the default. Overrides after the name
(`rlkit demo sft allocation_mode=fsdp:d1`) go to `rlkit submit` as they are: the same example on a smaller layout.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import rlkit as rlkit_package
from rlkit.cli.demos import DEMOS, Demo, generate_report, prepare
from rlkit.fsutil import own_directory

REPO = Path(rlkit_package.__file__).resolve().parents[1]  # the checkout, whatever this module's depth
ACTIVE = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "WAITING")


# Seconds each child `python -m rlkit COMMAND` may take: its own Slurm calls are bounded (60 s each,
# rlkit.launch.slurm) and it makes a few; submit also reads the config's files and renders the job.
DEADLINES_S = {"submit": 600.0, "status": 300.0}
DEFAULT_DEADLINE_S = 300.0


class NoAnswer(Exception):
    """A child `rlkit` command did not finish within its deadline (it was ended): the demo stops naming it."""


def rlkit(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m rlkit ARGS` in its own session, ended with everything it started (a hung sbatch, squeue) once its
    deadline (DEADLINES_S) passes: NoAnswer then, naming the command and how long it was given."""
    limit = DEADLINES_S.get(args[0], DEFAULT_DEADLINE_S) if args else DEFAULT_DEADLINE_S
    argv = [sys.executable, "-m", "rlkit", *args]
    child = subprocess.Popen(argv, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = child.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        _end(child)
        said = "it may have submitted the job before it hung: `rlkit status` lists the trial if so; " if (
            args[0] == "submit") else ""
        raise NoAnswer(f"`rlkit {args[0]}` did not answer within {limit:g} s and was ended; {said}the Slurm "
                       "controller may be slow or unreachable (try `squeue`), then run the demo again") from None
    except BaseException:  # Ctrl-C: its own session does not get the terminal's SIGINT
        _end(child)
        raise
    return subprocess.CompletedProcess(argv, child.returncode, out, err)


def _end(child: subprocess.Popen[str]) -> None:
    """SIGKILL to the child's session (its process group: the child and whatever it started), then reap it; its
    pipes are closed, not read to their end (something that left the group may hold them open)."""
    import signal

    with contextlib.suppress(ProcessLookupError):  # already gone, with everything it started
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    for pipe in (child.stdout, child.stderr):
        if pipe is not None:
            pipe.close()


def _row(name: str) -> dict[str, object] | None:
    """The trial's row of `rlkit status --json`, built in this process: a `python -m rlkit` per poll cost ~0.7 s of
    CPU on the login node (its imports), the job's own CPU on a small machine; None while Slurm does not answer."""
    from rlkit.cli.status import all_trials
    from rlkit.errors import SlurmError

    try:
        rows = [row.to_dict() for row in all_trials()]
    except SlurmError:
        return None
    return next((r for r in rows if r["name"] == name), None)


def wait_for(name: str, timeout: float, *, every: float = 5.0, unlisted: float = 120.0
             ) -> tuple[str, dict[str, object] | None]:
    """Poll the trial's status row (`_row`: what `rlkit status --json` shows) until its job has ended; print progress
    lines meanwhile. Its last state and status row (None: never listed). A submitted trial is listed at once (its
    record), so one still unlisted after `unlisted` seconds is a wrong name: say so rather than wait out `timeout`."""
    started = time.monotonic()
    deadline = started + timeout
    state, last, row = "PENDING", "", None
    while time.monotonic() < deadline:
        row = _row(name)
        if row is None and time.monotonic() - started > unlisted:
            return "NOT LISTED", None
        if row is not None:
            state = str(row["state"])
            line = f"  {name}: {state} step {row.get('step') or '-'} reward {row.get('reward') or '-'}"
            if line != last:
                print(line, flush=True)
                last = line
            if state not in ACTIVE:
                break
        time.sleep(every)
    return state, row


def _trials(config: Path, trial: str, overrides: list[str]) -> list[str]:
    """The submitted config's trials: a staged run's stage trials in order (its own record), else the one trial;
    named as submit named them (`experiment_name=` and `trial_name=` overrides win over the file and
    RLKIT_DEMO_TRIAL)."""
    from rlkit.config.load import parse_overrides, read_yaml
    from rlkit.trials.stage_runs import find_run

    given = parse_overrides(overrides)  # submit accepted them
    experiment = str(given.get("experiment_name") or read_yaml(config)["experiment_name"])
    trial = str(given.get("trial_name") or trial)
    run = find_run(f"{experiment}/{trial}")
    return [f"{experiment}/{stage.trial}" for stage in run.stages] if run else [f"{experiment}/{trial}"]


def _figures(demo: Demo, trial_dir: Path) -> str:
    from rlkit.trainer.stats_logger import read_metrics

    if demo.report is None:
        return generate_report(trial_dir)
    metrics_path = trial_dir / "metrics.jsonl"
    metrics = read_metrics(metrics_path) if metrics_path.is_file() else []
    return demo.report(metrics) if metrics else f"no metrics in {metrics_path}"


def _user() -> str:
    """This user's login name (its uid without one), from the uid: never $USER, which anyone may set."""
    import pwd

    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def submit_line(demo_dir: Path, config: Path, overrides: list[str]) -> str:
    """The submit command as the demo runs it, for a user to copy (from the checkout): RLKIT_FILEROOT only where the
    config reads it, not where a cluster.fileroot override wins over it; each word quoted for the shell."""
    where = {"RLKIT_DEMO_DIR": str(demo_dir)}
    if not any(o.startswith("cluster.fileroot=") for o in overrides):
        where["RLKIT_FILEROOT"] = os.environ["RLKIT_FILEROOT"]
    words = [f"{name}={shlex.quote(value)}" for name, value in where.items()]
    return " ".join([*words, shlex.join(["rlkit", "submit", str(config.relative_to(REPO)), *overrides])])


def run(demo: Demo, overrides: list[str] | None = None) -> int:
    # Per-user defaults: a shared machine's /tmp is everyone's, and the first user to run a demo owned /tmp/rlkit-demo
    # and /tmp/rlkit (the configs' fileroot), so the next one's demo failed in a PermissionError or submit's refusal.
    demo_dir = Path(os.environ.setdefault("RLKIT_DEMO_DIR", f"/tmp/rlkit-demo-{_user()}"))
    default_root = f"/tmp/rlkit-{_user()}"
    fileroot = os.environ.setdefault("RLKIT_FILEROOT", default_root)
    trial = os.environ.setdefault("RLKIT_DEMO_TRIAL", time.strftime("run_%Y%m%d_%H%M%S"))
    problem = own_directory(demo_dir)
    if problem is not None:
        print(f"error: demo directory {demo_dir}: {problem}\n  fix: set RLKIT_DEMO_DIR to a directory of your own "
              "that only you may write (or leave it unset: /tmp/rlkit-demo-<you>)", file=sys.stderr)
        return 2
    problem = own_directory(Path(fileroot)) if fileroot == default_root else None  # a name anyone could take first
    if problem is not None:
        print(f"error: demo fileroot {fileroot}: {problem}\n  fix: set RLKIT_FILEROOT to a directory of your own that "
              "only you may write", file=sys.stderr)
        return 2
    print(f"demo {demo.name}: {demo.summary}; preparing {', '.join(demo.needs)} in {demo_dir}", flush=True)
    prepare(demo, demo_dir)
    config = REPO / "configs" / demo.config
    overrides = overrides or []
    print(f"$ {submit_line(demo_dir, config, overrides)}", flush=True)
    submitted = rlkit("submit", str(config), *overrides)
    print(submitted.stdout + submitted.stderr, end="", flush=True)
    if submitted.returncode != 0:
        return submitted.returncode
    for name in _trials(config, trial, overrides):
        state, row = wait_for(name, 3600)
        print(f"$ rlkit status {name}", flush=True)
        shown = rlkit("status", name)
        print(shown.stdout + shown.stderr, end="")
        trial_dir = Path(str(row["trial_dir"])) if row is not None else None
        if state == "NOT LISTED":
            print(f"demo {demo.name}: `rlkit status` does not list {name} two minutes after its submit; `rlkit status` "
                  "lists the trials there are")
            return 1
        if state != "COMPLETED" or trial_dir is None:
            print(f"demo {demo.name}: {name} ended in state {state}; see `rlkit status {name}` and `rlkit logs {name}`")
            return 1
        print(f"demo {demo.name}: {name}: {_figures(demo, trial_dir)}")
        print(f"demo {demo.name}: metrics per step in {trial_dir / 'metrics.jsonl'} (TensorBoard: "
              f"{trial_dir / 'tensorboard'}); trained model (if any) in {trial_dir / 'checkpoints' / 'final'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="rlkit demo", description=__doc__)
    parser.add_argument("name", nargs="?", default="grpo", help=f"one of: {', '.join(DEMOS)} (default grpo)")
    parser.add_argument("overrides", nargs="*", help="key.path=value overrides for `rlkit submit`")
    parser.add_argument("--list", action="store_true", help="name every example and what it shows")
    args = parser.parse_args(argv)
    if args.list:
        for demo in DEMOS.values():
            print(f"{demo.name:10} {demo.summary} (configs/{demo.config})")
        return 0
    if args.name not in DEMOS:
        print(f"error: no demo {args.name!r}\n  fix: one of {', '.join(DEMOS)} (rlkit demo --list)", file=sys.stderr)
        return 2
    try:
        return run(DEMOS[args.name], args.overrides)
    except NoAnswer as exc:
        print(f"demo {args.name}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
