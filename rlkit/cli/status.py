"""What `rlkit status` and `rlkit logs` show: trials from the index, state from Slurm, servers from name resolve."""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlkit import untrusted_json
from rlkit.cli.console import literal, write_out
from rlkit.cli.status_slices import StepSlice, run_started, step_slices
from rlkit.config.served_models import served_auxiliary_models
from rlkit.errors import UserError
from rlkit.jobs.generate.summary import headline
from rlkit.launch import slurm
from rlkit.servers.health import probe_health
from rlkit.trials.paths import TrialPaths
from rlkit.trials.records import TrialRecord, find_trial, list_trials, read_json_dict

if TYPE_CHECKING:
    from rlkit.nameresolve.base import NameResolve

HEALTH_TIMEOUT_S = 3.0  # per server; all servers are asked at once (rlkit.servers.health.probe_health)
_FAILED_STEP = re.compile(r"rlkit: step (\S+) failed with exit code (\d+)")


@dataclass
class TrialRow:
    """One line of the trials table."""

    name: str
    job_id: str
    state: str
    elapsed: str
    nodes: str
    submitted: str
    trial_dir: str
    step: str = ""
    reward: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ServerRow:
    """One registered server as status shows it."""

    index: int
    address: str
    node: str
    healthy: bool
    weight_version: Any


@dataclass
class AuxiliaryServerRow:
    """One registered server of an auxiliary model (it never receives the policy's weights)."""

    model: str
    index: int
    address: str
    node: str
    healthy: bool


@dataclass
class TrialDetail:
    """Everything `rlkit status TRIAL` shows."""

    row: TrialRow
    reason: str
    exit_code: str
    components: list[tuple[str, str, str]]
    servers: list[ServerRow] = field(default_factory=list)
    auxiliary_servers: list[AuxiliaryServerRow] = field(default_factory=list)
    failed_step: str | None = None
    failed_step_tail: list[str] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)  # job ids, one per submit/resume
    trainer_status: str = ""
    cluster: str = ""  # cluster.cluster_name of the submitted config, from the manifest
    mismatch_warning: str = ""  # the trainer's last "server <i> log-probs differ" line (rlkit.trainer.mismatch)
    last_eval: str = ""  # the last evaluation on valid_dataset: its reward and weight version (rlkit.trainer.evaluator)
    epochs: str = ""  # trainer-only jobs (rw, dpo, sft: rlkit.trainer.offline_epochs): "epoch E/T  loss L"
    generated: str = ""  # a scored generate run's summary.json headline (rlkit.jobs.generate.summary)
    slices: list[StepSlice] = field(default_factory=list)  # the node and GPUs each step holds (a running job)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_progress(paths: TrialPaths) -> dict[str, Any]:
    """The trainer's progress.json (step, reward, servers' verified weight versions), or {} when there is none."""
    return read_json_dict(paths.progress)


def _row(record: TrialRecord, info: slurm.JobInfo) -> TrialRow:
    submitted = time.strftime("%Y-%m-%d %H:%M", time.localtime(record.submitted_at))
    progress = read_progress(TrialPaths(Path(record.trial_dir)))
    step = f"{_known_count(progress.get('step'))}/{_known_count(progress.get('total_steps'))}" \
        if "step" in progress else ""
    reward = f"{progress['reward']:.3f}" if isinstance(progress.get("reward"), (int, float)) else ""
    return TrialRow(record.name, record.job_id, info.state, info.elapsed, info.nodes, submitted, record.trial_dir,
                    step, reward)


def _known_count(value: object) -> str:
    """A step count of progress.json as shown, "?" when it is missing or not a count (the file is untrusted)."""
    return str(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else "?"


def all_trials() -> list[TrialRow]:
    """Every trial of this user with its job's state, newest first."""
    return [_row(r, trial_job(r)) for r in list_trials()]


def trial_job(record: TrialRecord) -> slurm.JobInfo:
    """The state of the trial's job, never of a later job Slurm gave its id to (slurm.trials_job_info)."""
    return slurm.trials_job_info(record.job_id, record.experiment, record.trial, record.trial_dir)


def trials_table(rows: list[TrialRow]) -> Table:
    table = Table(title=f"{len(rows)} trial(s)")
    for column in ("trial", "job", "state", "elapsed", "nodes", "submitted", "step", "reward"):
        table.add_column(column, no_wrap=True)
    for r in rows:
        style = {"RUNNING": "green", "COMPLETED": "cyan", "FAILED": "red", "PENDING": "yellow"}.get(r.state, "")
        # job-written values (progress.json, the index, sacct) are shown as written, never read as rich markup
        table.add_row(*map(literal, (r.name, r.job_id)), literal(r.state, style),
                      *map(literal, (r.elapsed, r.nodes, r.submitted, r.step, r.reward)))
    return table


def _servers(paths: TrialPaths) -> tuple[list[ServerRow], list[AuxiliaryServerRow]]:
    """The live servers of the policy and of each auxiliary model, each asked for its health."""
    from rlkit.config.load import load_config
    from rlkit.nameresolve import name_resolve_for

    config = load_config(paths.config)
    nr = name_resolve_for(config)
    verified = read_progress(paths).get("servers")  # versions the trainer read back and fingerprinted
    verified = verified if isinstance(verified, dict) else {}
    try:
        return server_rows(nr, [entry.name for entry in served_auxiliary_models(config)], verified,
                           HEALTH_TIMEOUT_S)
    finally:
        nr.close()


def server_rows(nr: NameResolve, auxiliary_models: Sequence[str], verified: Mapping[str, Any],
                timeout: float) -> tuple[list[ServerRow], list[AuxiliaryServerRow]]:
    """The registered servers of the policy and of each named auxiliary model, by index, with their health asked of
    all of them at once (`verified`: the weight versions the trainer fingerprinted, by server index)."""
    from rlkit.nameresolve import read_servers

    policy = read_servers(nr)
    auxiliary = [(name, r) for name in auxiliary_models for r in read_servers(nr, name)]
    healthy = probe_health([r.address for r in policy] + [r.address for _, r in auxiliary], timeout)
    return ([ServerRow(r.index, r.address, r.node, ok, verified.get(str(r.index), r.weight_version))
             for r, ok in zip(policy, healthy[:len(policy)], strict=True)],
            [AuxiliaryServerRow(name, r.index, r.address, r.node, ok)
             for (name, r), ok in zip(auxiliary, healthy[len(policy):], strict=True)])


def failed_step(paths: TrialPaths, job_id: str) -> str | None:
    """The step the batch script reported as failed first, from its log."""
    log = Path(str(paths.batch_log).replace("%j", job_id))
    if not log.is_file():
        return None
    match = _FAILED_STEP.search(log.read_text(errors="replace"))
    return match.group(1) if match else None


TAIL_MAX_BYTES = 64 << 20  # what `rlkit logs` reads back at most for its first lines (a line without end stops there)


def tail(path: Path, lines: int) -> list[str]:
    """The last `lines` lines of a log (none for 0: `[-0:]` was the whole log, and -n -5 all but its first 5 lines),
    read from its end: a job's log may be gigabytes."""
    if lines <= 0 or not path.is_file():
        return []
    with open(path, "rb") as f:
        start, block = f.seek(0, 2), b""
        while start > 0 and block.count(b"\n") <= lines and len(block) < TAIL_MAX_BYTES:
            step = min(start, 65536)
            start -= step
            f.seek(start)
            block = f.read(step) + block
    return block.decode("utf-8", errors="replace").splitlines()[-lines:]


def trial_detail(spec: str) -> TrialDetail:
    """Slurm state, components, live servers and, for a failed job, the failed step's last log lines."""
    record = find_trial(spec)
    info = trial_job(record)
    paths = TrialPaths(Path(record.trial_dir))
    detail = TrialDetail(_row(record, info), info.reason, info.exit_code, list(info.components))
    from rlkit.trials.records import attempts, read_manifest

    detail.attempts = [str(a.get("job_id")) for a in attempts(paths)]
    detail.cluster = str(read_manifest(paths).get("cluster_name", ""))
    progress = read_progress(paths)
    detail.trainer_status = trainer_status(str(progress.get("status", "")), active=info.active, state=info.state)
    detail.mismatch_warning = str(progress.get("logprob_mismatch_warning") or "")
    detail.last_eval = _last_eval(progress)
    detail.epochs = _epochs(progress, paths.metrics)
    detail.generated = generated_headline(paths.summary)
    if info.active and paths.config.is_file():
        detail.servers, detail.auxiliary_servers = _servers(paths)
    if info.state == "RUNNING":  # steps hold GPUs only then; logs older than this run are an earlier run's
        detail.slices = step_slices(paths.logs, since=run_started(info.elapsed))
    step = failed_step(paths, record.job_id)
    if step:
        detail.failed_step = step
        detail.failed_step_tail = tail(paths.step_log(step), 20)
    return detail


def generated_headline(summary: Path) -> str:
    """The headline of a scored generate run's summary.json, or "" (none: not scored, or not finished)."""
    data = read_json_dict(summary)
    return headline(data)[:400] if data else ""  # the file is untrusted: one short line


def trainer_status(written: str, *, active: bool, state: str) -> str:
    """The trainer's status as progress.json has it, except "running" once the job has ended: a trainer cancelled
    while it could not answer (frozen, killed) never wrote its last status, and must not look alive."""
    if written == "running" and not active:
        return f"was running when the job ended ({state or 'ended'})"
    return written


def _last_eval(progress: dict[str, Any]) -> str:
    """"reward R at weight version V" of the trainer's last evaluation (GRPO), the metrics of an offline job's last
    evaluation ("accuracy 0.950  reward_margin 1.200"), or "" before the first one."""
    version = progress.get("eval_version")
    offline = progress.get("eval")
    if not isinstance(version, int):
        if isinstance(offline, dict):
            return "  ".join(f"{name} {value:.3f}" if isinstance(value, (int, float)) else f"{name} {value}"
                             for name, value in offline.items())
        return ""
    reward = progress.get("eval_reward")
    score = f"{reward:.3f}" if isinstance(reward, (int, float)) else "none (no completion at one version)"
    return f"reward {score} at weight version {version}"


def _epochs(progress: dict[str, Any], metrics: Path) -> str:
    """"epoch E/T  loss L" of an offline job (its progress has total_epochs; the loss is the last step's in
    metrics.jsonl), or ""."""
    if not isinstance(progress.get("total_epochs"), int):
        return ""
    text = f"epoch {progress.get('epoch', 0)}/{progress['total_epochs']}"
    loss = _last_loss(metrics)
    return text + (f"  loss {loss:.4f}" if loss is not None else "")


def _last_loss(metrics: Path) -> float | None:
    """The last training loss (a "<algorithm>/loss" metric, not an eval one) in metrics.jsonl."""
    try:
        with open(metrics, "rb") as f:
            f.seek(max(0, f.seek(0, 2) - 65536))  # the last line is near the end: never read a long run's file
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            record = untrusted_json.loads(line)
        except ValueError:
            continue  # a line being written, or cut by the seek
        if isinstance(record, dict):
            for name, value in record.items():
                if name.endswith("/loss") and not name.startswith("eval/") and isinstance(value, (int, float)):
                    return float(value)
    return None


def print_detail(console: Console, d: TrialDetail) -> None:
    """Every value here is read from files and commands others write: printed literally (rich.markup.escape,
    markup=False, Text), never as rich markup; only rlkit's own bold and red are styled."""
    name, job_id, state = (escape(str(value)) for value in (d.row.name, d.row.job_id, d.row.state))
    console.print(f"[bold]{name}[/bold]  job {job_id}  [bold]{state}[/bold]"
                  + escape((f"  reason {d.reason}" if d.reason and d.reason != "None" else "")
                           + (f"  exit {d.exit_code}" if d.exit_code else "") + f"  elapsed {d.row.elapsed}"))
    console.print(f"  trial directory: {d.row.trial_dir}" + (f"  cluster {d.cluster}" if d.cluster else ""),
                  markup=False)
    if d.row.step:
        console.print(f"  training step {d.row.step}" + (f"  reward {d.row.reward}" if d.row.reward else "")
                      + (f"  trainer {d.trainer_status}" if d.trainer_status else ""), markup=False)
    if d.epochs:
        console.print(f"  {d.epochs}", markup=False, highlight=False)
    if d.generated:
        console.print(f"  scored: {d.generated}", markup=False, highlight=False)
    if d.last_eval:
        console.print(f"  last eval: {d.last_eval}", markup=False, highlight=False)
    if d.mismatch_warning:
        console.print(f"  last log-prob mismatch warning: {d.mismatch_warning}", style="yellow", markup=False,
                      highlight=False)
    if len(d.attempts) > 1:
        console.print(f"  attempt {len(d.attempts)} (jobs {', '.join(d.attempts)})", markup=False)
    for comp_id, state, nodes in d.components:
        console.print(f"  component {comp_id}: {state} on {nodes}", markup=False)
    for piece in d.slices:
        console.print(f"  {piece.text()}", markup=False, highlight=False)
    if d.servers:
        table = Table(title="servers")
        for column in ("index", "address", "node", "health", "weight version"):
            table.add_column(column)
        for s in d.servers:
            table.add_row(str(s.index), literal(s.address), literal(s.node), "ok" if s.healthy else "[red]down[/red]",
                          literal(s.weight_version))
        console.print(table)
    if d.auxiliary_servers:
        table = Table(title="auxiliary servers")
        for column in ("model", "index", "address", "node", "health"):
            table.add_column(column)
        for a in d.auxiliary_servers:
            table.add_row(literal(a.model), str(a.index), literal(a.address), literal(a.node),
                          "ok" if a.healthy else "[red]down[/red]")
        console.print(table)
    if d.failed_step:
        console.print(f"[red]step {escape(str(d.failed_step))} failed[/red]; its last log lines:")
        for line in d.failed_step_tail:
            console.print(f"  {line}", markup=False, highlight=False)


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")


def _log_path(paths: TrialPaths, record: TrialRecord, step: str | None) -> Path:
    if step is None:
        return Path(str(paths.batch_log).replace("%j", record.job_id))
    steps = sorted(p.stem for p in paths.logs.glob("*.log"))
    path = paths.step_log(step)
    if step not in steps or not path.is_file():  # by name: never a path built from --step (too long, or ../)
        raise UserError(f"trial {record.name} has no log for step '{step}'",
                        hint=f"steps with logs: {', '.join(steps) or 'none yet (is the job still pending?)'}")
    return path


def show_logs(spec: str, *, step: str | None, follow: bool, lines: int) -> None:
    """Print the last lines of a log; with follow, keep printing until the job has ended."""
    record = find_trial(spec)
    path = _log_path(TrialPaths(Path(record.trial_dir)), record, step)
    for line in tail(path, lines):
        write_out(line + "\n")
    if not follow:
        return
    position = path.stat().st_size if path.is_file() else 0
    last_check = time.monotonic()
    while True:
        if path.is_file() and path.stat().st_size > position:
            with open(path, encoding="utf-8", errors="replace") as f:
                f.seek(position)
                write_out(f.read())
                position = f.tell()
            sys.stdout.flush()
        if time.monotonic() - last_check > 5:
            last_check = time.monotonic()
            if not trial_job(record).active:  # a later job given its id may run on
                return
        time.sleep(0.5)
