"""`rlkit doctor CONFIG`: before a long job waits in the queue, run what its steps depend on, on the nodes it asks
for, in a few seconds, and name each broken part with its fix.

The config is checked and planned as `rlkit submit` would (every mistake exits 2, nothing submitted); then one short
job of one task per node (as many nodes as the plan's components hold, each with the GPUs of its component; for a
packed plan, the nodes of its one shared request with its GPUs per node) is submitted with submitit, a
single-function Slurm job, which is what submitit is for. Each task runs rlkit.steps.doctor_node's checks.
submitit's folder, where the tasks also meet for the all-reduce, sits under $RLKIT_HOME (the user's home, shared on
clusters), so that a fileroot some node cannot see is reported as such instead of stopping the doctor itself.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from rlkit.config.load import to_yaml
from rlkit.config.model_config import is_local_path
from rlkit.config.schema.experiment import ExperimentConfig
from rlkit.images.labels import is_image_uri
from rlkit.launch.containers import container_argv, container_lacks_gpu_driver
from rlkit.launch.plan import SERVER_ROLE, SHARED_ROLE, JobPlan, Step
from rlkit.launch.single_jobs import QUEUE_WAIT_MIN, last_line, submit_function, wait_for_job
from rlkit.launch.submit import Prepared
from rlkit.steps.doctor_node import Check, NodeReport, NodeSpec
from rlkit.trials.records import state_dir, write_atomic

DOCTOR_TIME_MIN = 10


@dataclass(frozen=True)
class DoctorRun:
    job_id: str
    checks: list[Check]

    @property
    def ok(self) -> bool:
        return bool(self.checks) and all(c.ok for c in self.checks)


def node_layout(plan: JobPlan) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """(role, GPUs) of each node of the job: component by component (servers first, as the plan orders them), or, for
    a packed plan, the shared request's nodes with its GPUs per node (what the job gets on each), each node's role
    naming the roles of the steps on it in the plan's order ("server+trainer")."""
    if plan.shared is not None:
        on_node: list[list[str]] = [[] for _ in range(plan.shared.nodes)]
        for step in plan.steps:
            for node in step.job_nodes:
                if step.role not in on_node[node]:
                    on_node[node].append(step.role)
        return (tuple("+".join(roles) or SHARED_ROLE for roles in on_node),
                (plan.shared.gpus_per_node,) * plan.shared.nodes)
    roles: list[str] = []
    gpus: list[int] = []
    for component in plan.components:
        roles += [component.role] * component.nodes
        gpus += [component.gpus_per_node] * component.nodes
    return tuple(roles), tuple(gpus)


def _as_step_runs(step: Step, plan: JobPlan, module: str, *args: str, extra_bind: str) -> tuple[str, ...]:
    """`module` run the way `step` runs in the job: its environment additions, launcher.python, its image and
    binds (plus the doctor's folder, where its files are)."""
    binds = (*plan.binds, extra_bind) if plan.binds else ()
    inner = container_argv((step.argv[0], "-m", module, *args), container_type=plan.container_type, image=step.image,
                           apptainer_args=plan.apptainer_args, binds=binds)
    return (("env", *(f"{k}={v}" for k, v in step.env)) if step.env else ()) + inner


def node_spec(prepared: Prepared, workdir: Path, token: str) -> NodeSpec:
    """What every task checks: the canary in the fileroot, the layout, the model, the images, and the all-reduce
    and server start, each run as the job's trainer and server steps run."""
    config, plan = prepared.config, prepared.plan
    roles, gpus = node_layout(plan)
    work = [step for step in plan.steps if step.role != SERVER_ROLE][-1]
    servers = [step for step in plan.steps if step.role == SERVER_ROLE]
    allreduce = _as_step_runs(work, plan, "rlkit.steps.doctor_allreduce", extra_bind=str(workdir))
    serve: tuple[str, ...] = ()
    if servers:  # the server's config as the job's steps read it, beside submitit's files
        write_atomic(workdir / "config.yaml", to_yaml(config), mode=0o600)
        serve = _as_step_runs(servers[0], plan, "rlkit.steps.doctor_serve", str(workdir / "config.yaml"),
                              str(config.launcher.server_startup_timeout), extra_bind=str(workdir))
    images = tuple(dict.fromkeys(step.image for step in plan.steps if step.image and not is_image_uri(step.image)))
    model = config.actor.path if is_local_path(config.actor.path) else ""
    return NodeSpec(canary=str(Path(config.cluster.fileroot) / f".rlkit-doctor-{workdir.name}"), token=token,
                    shared_dir=str(workdir), roles=roles, gpus=gpus, model=model, allreduce_argv=allreduce,
                    container_type=plan.container_type, images=images if plan.container_type != "none" else (),
                    serve_argv=serve, serve_timeout_s=float(config.launcher.server_startup_timeout),
                    driverless_container=container_lacks_gpu_driver(plan.container_type, plan.apptainer_args),
                    code_tool=_code_tool_settings(config))


def _code_tool_settings(config: ExperimentConfig) -> tuple[str, ...]:
    """What the doctor's code-tool check needs of rollout.agent.code_tool, () when no run uses it."""
    tool = config.rollout.agent.code_tool
    if not (tool.enabled and config.rollout.agent.workflow.strip()):
        return ()
    return (tool.isolation, tool.python, tool.scratch_root)


def run_doctor(prepared: Prepared, *, say: Callable[[str], object] = print, wait_min: float | None = None
               ) -> DoctorRun:
    """Submit the doctor's job, wait for it (at most `wait_min` minutes; default its time limit and QUEUE_WAIT_MIN
    in the queue: past it a SlurmError says how to follow or cancel it), and return every node's checks."""
    from rlkit.steps.doctor_node import run_node_checks

    workdir = state_dir("doctor") / f"{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"
    workdir.mkdir(parents=True, mode=0o700)
    token = secrets.token_hex(16)
    spec = node_spec(prepared, workdir, token)
    canary = Path(spec.canary)
    canary.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(canary, token + "\n", mode=0o600)
    slurm = prepared.config.launcher.slurm
    extra = {key: value for key, value in (("nodelist", slurm.nodelist), ("exclude", slurm.exclude),
                                           ("account", slurm.account), ("qos", slurm.qos),
                                           ("constraint", slurm.constraint)) if value}
    params: dict[str, object] = {"nodes": len(spec.roles), "tasks_per_node": 1, "cpus_per_task": 1,
                                 "timeout_min": DOCTOR_TIME_MIN, "name": "rlkit-doctor", "mem_gb": 1,
                                 "slurm_additional_parameters": extra}
    if max(spec.gpus, default=0):
        params["gpus_per_node"] = max(spec.gpus)
    try:
        job = submit_function(workdir, params, slurm.partition, run_node_checks, spec, what="the doctor's job")
        wait_min = DOCTOR_TIME_MIN + QUEUE_WAIT_MIN if wait_min is None else wait_min
        say(f"doctor job {job.job_id}: {len(spec.roles)} node(s) of partition {slurm.partition or '(default)'}; "
            f"waiting up to {wait_min:g} minutes (submitit files in {workdir})")
        wait_for_job(job, wait_min * 60, "the doctor's job", workdir)
        try:
            reports: list[NodeReport] = job.results()
        except Exception as exc:  # a task that could not even start: submitit's reason, e.g. an unreadable folder
            return DoctorRun(str(job.job_id), [Check("doctor job", "-", False, last_line(exc),
                                                     f"submitit's files in {workdir} must be on a filesystem the "
                                                     "compute nodes share: set RLKIT_HOME to such a directory")])
    finally:
        canary.unlink(missing_ok=True)
    return DoctorRun(str(job.job_id), [check for report in reports for check in report.checks])



def summary_rows(checks: list[Check]) -> list[tuple[str, str, bool, str, str]]:
    """(check, nodes, ok, detail, fix) rows: one per check that passed everywhere ("all N nodes"), else one per
    distinct failure with the nodes it hit, so a 64-node job reads as a few lines."""
    nodes = sorted({c.node for c in checks})
    rows: list[tuple[str, str, bool, str, str]] = []
    for name in dict.fromkeys(c.name for c in checks):
        of_check = [c for c in checks if c.name == name]
        failed = [c for c in of_check if not c.ok]
        if not failed:
            where = f"all {len(nodes)} nodes" if len(of_check) == len(nodes) and len(nodes) > 1 else of_check[0].node
            rows.append((name, where, True, of_check[0].detail, ""))
            continue
        by_reason: dict[tuple[str, str], list[str]] = {}
        for c in failed:
            by_reason.setdefault((c.detail, c.fix), []).append(c.node)
        for (detail, fix), hit in by_reason.items():
            rows.append((name, ", ".join(hit), False, detail, fix))
    return rows
