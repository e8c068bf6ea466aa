"""Render (pure): a JobPlan -> the text of one sbatch script (heterogeneous when the plan has several components).

The script is the plan's #SBATCH lines, then supervisor.sh (the template beside this module, which starts every step
in the background and supervises them) with the plan's values and one function per step filled in. Steps are
stopped with `scancel --ctld --signal=TERM` on each component (a TERM to srun itself would SIGKILL the tasks,
leaving servers no time to deregister), then forced.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import replace
from importlib import resources
from pathlib import Path

from rlkit import __version__
from rlkit.config.strings import sbatch_quote
from rlkit.launch.containers import container_argv
from rlkit.launch.plan import Component, JobPlan, Step
from rlkit.step_contract import (
    EXIT_REQUEUE,
    JOB_END,
    JOB_LOCK,
    NO_RETRY_EXIT,
    NO_RETRY_MARK,
    NODE_CHECK_ADDRESS_MARK,
    NODE_CHECK_STEP,
    STATUS_REQUEUE,
    STATUS_STOPPED,
    STEP_STATE,
)
from rlkit.trials.paths import TrialPaths

SUPERVISOR_TEMPLATE = "supervisor.sh"  # next to this module: the script's body, checked by shellcheck in the tests
NODE_CHECK_TIMEOUT_S = 120  # step 0 bounds its own waits (seconds); this only ends an srun that hangs
NODE_CHECK_MEM_MB = 256  # a python (in its container) reading a file and opening a socket


def supervisor_template() -> str:
    """The template's text (package data, so it ships with rlkit into the images)."""
    return resources.files("rlkit.launch").joinpath(SUPERVISOR_TEMPLATE).read_text(encoding="utf-8")


def _fill(template: str, fields: dict[str, str]) -> str:
    """Substitute every @NAME@; a field the template lacks or a placeholder left over is a bug, caught here."""
    for name, value in fields.items():
        placeholder = f"@{name}@"
        if placeholder not in template:
            raise ValueError(f"the supervisor template has no {placeholder}")
        template = template.replace(placeholder, value)
    if leftover := re.search(r"@[A-Z_]+@", template):
        raise ValueError(f"the supervisor template's {leftover.group(0)} was not filled in")
    return template


def _q(argv: tuple[str, ...] | list[str]) -> str:
    return " ".join(shlex.quote(a) for a in argv)


def _component_lines(index: int, component: Component, plan: JobPlan) -> list[str]:
    lines = []
    if index == 0:
        lines += [f"#SBATCH {sbatch_quote('--job-name=' + plan.job_name)}",
                  f"#SBATCH {sbatch_quote('--output=' + plan.batch_log)}"]
        lines += [f"#SBATCH {sbatch_quote(opt)}" for opt in plan.job_options]
    else:
        lines.append("#SBATCH hetjob")
    lines += [f"#SBATCH {sbatch_quote(opt)}" for opt in plan.component_options]
    if component.nodelist:
        lines.append(f"#SBATCH --nodelist={component.nodelist}")
    lines.append(f"#SBATCH --nodes={component.nodes}")
    if not plan.packed:  # a packed job's steps set their own task counts (one --ntasks-per-node would not fit all)
        lines.append(f"#SBATCH --ntasks-per-node={component.ntasks_per_node}")
    lines += [
        f"#SBATCH --cpus-per-task={component.cpus_per_task}",
        f"#SBATCH --mem={component.mem_per_node_mb}M",
    ]
    if component.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{component.gpus_per_node}")
    return lines


def work_step_options(step: Step) -> tuple[str, ...]:
    """A work step's own srun options: exactly its resources (the steps share the allocation), the whole step ended
    when one of its tasks fails, its output appended to its own log."""
    return ("--exact", "--kill-on-bad-exit=1", f"--output={step.log}", "--open-mode=append")


def step_command(step: Step, plan: JobPlan, *, options: tuple[str, ...] | None = None,
                 wrapper: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The full `[env ...] [wrapper] srun ... [apptainer exec ...] python -m rlkit ...` argv of one step: every step,
    step 0 included, gets its environment, python, image, binds and srun arguments here. `options`: the step's own
    srun options (default: a work step's, `work_step_options`); `wrapper`: a command srun runs under (a timeout)."""
    het = len(plan.components) > 1 and not plan.packed
    srun = [*wrapper, "srun", *([f"--het-group={step.het_group}"] if het else []),
            f"--job-name={step.name}", f"--nodes={step.nodes}", f"--ntasks={step.ntasks}"]
    if step.relative_node is not None:
        srun.append(f"--relative={step.relative_node}")
    if step.gpus_per_node:
        srun.append(f"--gres=gpu:{step.gpus_per_node}")
    elif plan.packed and plan.requests[0].gpus_per_node:
        srun.append("--gres=none")  # in a job with GPUs, a step that asks for none would get every GPU of its nodes
    # --chdir=/: the step runs from a directory nobody else can write, not the trial directory the script is in, so
    # `python -m rlkit` (whose sys.path starts with the working directory) never imports a planted rlkit/ from there
    srun += [f"--cpus-per-task={step.cpus_per_task}", f"--mem={step.mem_mb}M",
             *(work_step_options(step) if options is None else options), "--chdir=/", *plan.srun_args]
    inner = container_argv(step.argv, container_type=plan.container_type, image=step.image,
                           apptainer_args=plan.apptainer_args, binds=plan.binds)
    env = ("env", *(f"{k}={v}" for k, v in step.env)) if step.env else ()
    return (*env, *srun, *inner)


def policy_table(plan: JobPlan) -> list[str]:
    """The supervisor's policy table: one `component_policy GROUP ROLE WORK RESTART REPORTS_STATE` line per
    component (rlkit.launch.plan.ComponentPolicy), so the script decides by the table, never by a role's name."""
    return [f"component_policy {group} {c.role} {int(c.policy.work)} {c.policy.restart} {int(c.policy.reports_state)}"
            for group, c in enumerate(plan.components)]


def render_script(plan: JobPlan) -> str:
    """The sbatch script for a plan (deterministic: the same plan gives the same text)."""
    lines = ["#!/bin/bash", f"# rlkit {__version__}: trial {plan.trial_dir}", "#"]
    lines += [f"# {note}" for note in plan.notes]
    for index, request in enumerate(plan.requests):
        lines += _component_lines(index, request, plan)
    steps = policy_table(plan)
    for step in plan.steps:
        fn = "cmd_" + step.name.replace("-", "_")
        steps += [f"{fn}() {{", f"  {_q(step_command(step, plan))}", "}",
                  f"start_step {step.name} {step.het_group} {fn}"]
    body = supervisor_body(trial_dir=plan.trial_dir, attempt=plan.attempt, retries=plan.retries,
                           trainer_group=plan.trainer_group, steps=steps, node_checks=node_check_lines(plan),
                           packed=plan.packed)
    return "\n".join(lines) + "\n\n" + body


def _checked_steps(plan: JobPlan) -> list[Step]:
    """What step 0 checks, one srun each: every component's nodes with its GPUs per node (heterogeneous), or every
    step on its own nodes with its own slice (packed: each step must see exactly its GPUs). The work component's
    (or work step's) check comes last."""
    if plan.packed:
        return list(plan.steps)
    checks = []
    for group, component in enumerate(plan.components):
        step = next(s for s in plan.steps if s.het_group == group)
        checks.append(replace(step, nodes=component.nodes, gpus_per_node=component.gpus_per_node,
                              mem_mb=component.mem_per_node_mb, relative_node=None))
    return checks


def node_check_command(index: int, plan: JobPlan) -> tuple[str, ...]:
    """Step 0 on one component (or one step of a packed job): rlkit.steps.node_check on each of its nodes, built by
    `step_command` from the component's first step (its environment additions, python, image, binds and srun
    arguments) with one task per node and the GPUs asked for explicitly. The supervisor appends the token's and
    address file's arguments, which exist only at run time."""
    return _node_check(index, _checked_steps(plan), plan)


def _node_check(index: int, checks: list[Step], plan: JobPlan) -> tuple[str, ...]:
    """node_check_command for check `index` of `checks` (computed once per script by node_check_lines)."""
    checked = checks[index]
    role = plan.components[checked.het_group].role
    check = [checked.argv[0], "-m", "rlkit.steps.node_check", f"--role={role}",
             f"--gpus={checked.gpus_per_node}", *(["--container"] if plan.container_type != "none" else [])]
    others = sum(c.nodes for c in checks) - 1
    if others:  # every other node (task) connects to the work component's first node
        work = plan.components[plan.trainer_group]
        check += [f"--target-group={plan.trainer_group}", f"--target-role={work.role}"]
        check += [f"--listen={others}"] if index == len(checks) - 1 else []
    node_check = replace(checked, name=NODE_CHECK_STEP, ntasks=checked.nodes, cpus_per_task=1,
                         mem_mb=min(NODE_CHECK_MEM_MB, checked.mem_mb), argv=tuple(check),
                         log=str(TrialPaths(Path(plan.trial_dir)).step_log(NODE_CHECK_STEP)))
    # every node reports, whichever fails first; its output goes to the supervisor, which reads the address line
    return step_command(node_check, plan, options=("--ntasks-per-node=1", "--kill-on-bad-exit=0"),
                        wrapper=("timeout", str(NODE_CHECK_TIMEOUT_S)))


def node_check_lines(plan: JobPlan) -> list[str]:
    """Bash lines defining one function per check that runs it, and NODE_CHECKS naming them."""
    lines = []
    checks = _checked_steps(plan)
    for index in range(len(checks)):
        lines += [f"node_check_{index}() {{", f'  {_q(_node_check(index, checks, plan))} "$@"', "}"]
    names = " ".join(f"node_check_{index}" for index in range(len(checks)))
    return [*lines, f"NODE_CHECKS=({names})  # the supervisor runs them all at once"]


def supervisor_body(*, trial_dir: str, attempt: int, retries: int, trainer_group: int, steps: list[str],
                    node_checks: list[str], packed: bool = False) -> str:
    """The template filled in: the step_contract's words and codes, the plan's numbers, `steps` (bash lines that
    define and start each step) where @STEPS@ stands, `node_checks` (bash lines defining step 0's function per
    component and NODE_CHECKS) where @NODE_CHECKS@ stands."""
    return _fill(supervisor_template(), {
        "TRIAL_DIR": shlex.quote(trial_dir), "ATTEMPT": str(attempt), "RETRIES": str(retries),
        "NO_RETRY_EXIT": str(NO_RETRY_EXIT),
        "NO_RETRY_MARK": shlex.quote(NO_RETRY_MARK), "EXIT_REQUEUE": str(EXIT_REQUEUE),
        "STATUS_REQUEUE": shlex.quote(STATUS_REQUEUE), "STATUS_STOPPED": shlex.quote(STATUS_STOPPED),
        "STEP_STATE": shlex.quote(STEP_STATE), "JOB_END": shlex.quote(JOB_END), "JOB_LOCK": shlex.quote(JOB_LOCK),
        "TRAINER_GROUP": str(trainer_group),
        "PACKED": str(int(packed)), "STEPS": "\n".join(steps),
        "NODE_CHECKS": "\n".join(node_checks),
        "NODE_CHECK_ADDRESS_MARK": shlex.quote(NODE_CHECK_ADDRESS_MARK),
        "NODE_CHECK_LOG": shlex.quote(str(TrialPaths(Path(trial_dir)).step_log(NODE_CHECK_STEP))),
    })
