"""What `rlkit doctor` checks on each node of the job it submits (one task per node, run by submitit).

Each check answers for this node: can it read what the login node wrote in the fileroot, does it see the GPUs Slurm
gave it, can it run the role's image, can it read the model, and can it join a tiny all-reduce with every other node
of the job (the group a broadcast weight sync forms: servers and trainer). A check never raises: it reports, so one
broken part does not hide the others. Importing this module imports no torch (the all-reduce runs in the trainer's
own interpreter or image, rlkit.steps.doctor_allreduce).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlkit.slurm.jobenv import JobEnv
from rlkit.steps.node_check import canary_seen, gpu_shortfall, nvidia_smi_listing, visible_gpus

ALLREDUCE_TIMEOUT_S = 90  # rank 0's address, the group's forming and one all-reduce, whatever hangs


@dataclass(frozen=True)
class NodeSpec:
    """What the doctor's job checks; the same for every task (picklable: submitit sends it to the nodes)."""

    canary: str  # a file in the fileroot holding `token`
    token: str
    shared_dir: str  # submitit's folder: rank 0 publishes its all-reduce address here
    roles: tuple[str, ...]  # the role of each task (task i runs on node i of the job); "server+trainer": a node
    # that steps of several roles share (a packed job)
    gpus: tuple[int, ...]  # the GPUs each task's node must see
    model: str  # a local model directory the steps read ("" for a hub id)
    allreduce_argv: tuple[str, ...]  # the command of the all-reduce, in the trainer's image when there is one
    container_type: str
    images: tuple[str, ...] = ()  # the role images this node must be able to read
    serve_argv: tuple[str, ...] = ()  # starts one server as the serve step would (first server node only)
    serve_timeout_s: float = 600.0
    driverless_container: bool = False  # the steps' container has no NVIDIA driver (apptainer without --nv)
    code_tool: tuple[str, ...] = ()  # (isolation, python, scratch_root) of an enabled code tool, else ()


@dataclass(frozen=True)
class Check:
    name: str
    node: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class NodeReport:
    node: str
    role: str
    checks: list[Check] = field(default_factory=list)

    def add(self, name: str, ok: bool, detail: str, fix: str = "") -> None:
        self.checks.append(Check(name, self.node, ok, detail, "" if ok else fix))


def run_node_checks(spec: NodeSpec) -> NodeReport:
    """Every check on this node, in the order a job would need them."""
    env = JobEnv.from_environ()
    report = NodeReport(env.node_name, spec.roles[env.global_rank] if env.global_rank < len(spec.roles) else "?")
    _check_fileroot(spec, report)
    _check_gpus(spec.gpus[env.global_rank] if env.global_rank < len(spec.gpus) else 0, report,
                driverless_container=spec.driverless_container)
    _check_container(spec, report)
    _check_model(spec.model, report)
    _check_allreduce(spec, env, report)
    if spec.serve_argv and env.global_rank == first_server_node(spec.roles):
        _check_server(spec, report)
    if spec.code_tool and env.global_rank == first_trainer_node(spec.roles):
        check_code_tool(spec.code_tool, report)
    return report


def first_trainer_node(roles: tuple[str, ...]) -> int | None:
    """The node of the trainer's rank 0 (the job's first trainer node), where the code tool runs the model's code."""
    return next((i for i, role in enumerate(roles) if "trainer" in role.split("+")), None)


def check_code_tool(settings: tuple[str, ...], report: NodeReport) -> None:
    """One trivial run of the code tool as the trainer would start it: the isolation this node gives, and whether
    the config's `isolation` lets the model's code run here."""
    import tempfile

    from rlkit.agent.code_tool import CodeLimits, run_python

    isolation, python, scratch_root = settings
    try:
        with tempfile.TemporaryDirectory(prefix="rlkit-doctor-code-", dir=scratch_root) as root:
            Path(root).chmod(0o711)
            result = run_python("print('ok')", limits=CodeLimits(), scratch_root=Path(root), python=python or None,
                                isolation=isolation)
    except OSError as exc:
        report.add("code tool", False, f"no scratch directory in {scratch_root}: {exc}",
                   "set rollout.agent.code_tool.scratch_root to a node-local directory every user can traverse")
        return
    notes = f" ({'; '.join(result.notes)[:300]})" if result.notes else ""
    if result.ok and result.isolated:
        report.add("code tool", True, f"full isolation (namespaces, private /proc, read-only mounts){notes}")
    elif result.ok:
        report.add("code tool", True, f"runs with partial isolation (isolation: best_effort){notes}")
    else:
        needs = ("a kernel with Landlock enabled (Linux >= 5.13, `landlock` in the lsm= boot list) or Linux >= 5.5 "
                 "(the seccomp listener)" if "host FIFOs" in f"{result.error}" else
                 "unprivileged user namespaces on the nodes (user.max_user_namespaces > 0; Debian: "
                 "kernel.unprivileged_userns_clone=1)")
        report.add("code tool", False, f"{result.error}"[:400],
                   f"enable {needs}, or set rollout.agent.code_tool.isolation=best_effort to run the model's code "
                   "with what holds (docs/guides/code-tool.md, its table)")


def first_server_node(roles: tuple[str, ...]) -> int | None:
    """The first node with a server on it (alone, or beside other roles' steps: "server+trainer"), which starts the
    one server of the server check."""
    return next((i for i, role in enumerate(roles) if "server" in role.split("+")), None)


def _check_fileroot(spec: NodeSpec, report: NodeReport) -> None:
    seen = canary_seen(spec.canary)
    report.add("shared fileroot", seen == spec.token,
               "reads the token the login node wrote" if seen == spec.token else f"{spec.canary}: {seen}",
               "put cluster.fileroot on a filesystem every compute node mounts at the same path as the login node")


def _check_gpus(expected: int, report: NodeReport, *, driverless_container: bool = False) -> None:
    """Counted and judged as step 0 of every job does (rlkit.steps.node_check), on the host: a container started
    with --nv sees the host's driver and GPUs, one started without (`driverless_container`) sees no driver."""
    if expected == 0:
        report.add("GPUs", True, "none asked for")
        return
    listing, smi_error = (None, "") if driverless_container else nvidia_smi_listing()
    view = visible_gpus(os.environ.get("CUDA_VISIBLE_DEVICES"), listing)
    shortfall = gpu_shortfall(report.role, expected, view, in_container=driverless_container, smi_error=smi_error)
    if shortfall is None:
        report.add("GPUs", True, f"{view.count} visible of {expected} asked for")
    else:
        report.add("GPUs", False, shortfall.detail, shortfall.fix)


def _check_container(spec: NodeSpec, report: NodeReport) -> None:
    if spec.container_type == "none":
        report.add("container", True, "container_type none: steps run on the host")
        return
    if shutil.which("apptainer") is None:
        report.add("container", False, "apptainer is not installed (not on PATH)",
                   "use a partition whose nodes have Apptainer, or launcher.slurm.container_type=none")
        return
    unreadable = [image for image in spec.images if not os.access(image, os.R_OK)]
    report.add("container", not unreadable, "apptainer found, images readable" if not unreadable
               else f"cannot read {', '.join(unreadable)}", "put the images on a filesystem the nodes mount")


def _check_model(model: str, report: NodeReport) -> None:
    if not model:
        report.add("model", True, "a hub id: fetched at submit into the hub cache")
        return
    ok = os.access(Path(model) / "config.json", os.R_OK)
    report.add("model", ok, f"{model} readable" if ok else f"{model}/config.json is not readable here",
               "put actor.path on a filesystem every compute node mounts")


def _json_answer(stdout: str) -> dict[str, object]:
    try:
        answer = json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else {}
    except ValueError:
        return {}
    return answer if isinstance(answer, dict) else {}


def _run_helper(name: str, argv: list[str], timeout: float, report: NodeReport, *, hung_fix: str,
                missing_fix: str) -> tuple[int, dict[str, object], str] | None:
    """Run a check's helper process (it prints one JSON line): its exit code, answer and stderr; None once the
    reason it gave no answer (hung, or could not start) is reported."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd="/", timeout=timeout)
    except subprocess.TimeoutExpired:
        report.add(name, False, f"no answer within {timeout:.0f} s", hung_fix)
        return None
    except OSError as exc:
        report.add(name, False, f"{argv[0]} cannot run: {exc.strerror or exc}", missing_fix)
        return None
    return done.returncode, _json_answer(done.stdout), done.stderr


def _check_server(spec: NodeSpec, report: NodeReport) -> None:
    fix = "read the server's last lines; check the model, the server image and vllm/sglang.extra_args"
    ran = _run_helper("server start", list(spec.serve_argv), spec.serve_timeout_s + 60, report, hung_fix=fix,
                      missing_fix="check launcher.python (or the server image)")
    if ran is None:
        return
    _, answer, stderr = ran
    if answer.get("ok"):
        report.add("server start", True, f"{answer['backend']} healthy and guarded in {answer['seconds']} s")
        return
    last = answer.get("last_lines")
    lines = [str(line) for line in last] if isinstance(last, list) else stderr.strip().splitlines()[-3:]
    reason = str(answer.get("error") or "no answer")
    report.add("server start", False, (reason + " | " + " / ".join(lines))[:600], fix)


def _check_allreduce(spec: NodeSpec, env: JobEnv, report: NodeReport) -> None:
    argv = [*spec.allreduce_argv, spec.shared_dir, str(env.global_rank), str(env.world_size)]
    network_fix = "open the ports between the job's nodes (gloo/NCCL pick free TCP ports) or check their network"
    ran = _run_helper("all-reduce", argv, ALLREDUCE_TIMEOUT_S, report, hung_fix=network_fix,
                      missing_fix="check launcher.python, and the container check above")
    if ran is None:
        return
    returncode, answer, stderr = ran
    if returncode == 0 and answer.get("ok"):
        report.add("all-reduce", True, f"{answer['backend']} over {env.world_size} nodes in {answer['seconds']} s")
        return
    reason = str(answer.get("error") or (stderr.strip().splitlines() or ["no output"])[-1])
    report.add("all-reduce", False, reason[:300], network_fix)
