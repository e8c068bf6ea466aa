"""Render (pure): a JobPlan -> the text of one sbatch script (heterogeneous when the plan has several components).

The script starts every step in the background and supervises them: it exits non-zero as soon as any step fails
(after stopping the others), stops the servers once the trainer/client step succeeds, and forwards a TERM from
Slurm to every step, so no step is ever left running. Steps are stopped with `scancel --ctld --signal=TERM` on each
component (a TERM to srun itself would SIGKILL the tasks, leaving servers no time to deregister), then forced.
"""

from __future__ import annotations

import shlex

from rlkit import __version__
from rlkit.config.strings import sbatch_quote
from rlkit.launch.containers import container_argv
from rlkit.launch.plan import Component, JobPlan, Step
from rlkit.step_contract import EXIT_REQUEUE, NO_RETRY_EXIT, STATUS_REQUEUE, STATUS_STOPPED

_SUPERVISOR_TEXT = r"""
STOP_GRACE=30  # seconds steps get to stop cleanly (servers deregister) before srun is made to kill them
PIDS=()
NAMES=()
ROLES=()

FNS=()
RESTARTS=()
LAST_STEP=()

start_step() {  # start_step NAME ROLE FUNCTION: run one srun step (a function holding its command) in the background
  local name=$1 role=$2 fn=$3
  "$fn" &
  PIDS+=("$!")
  NAMES+=("$name")
  ROLES+=("$role")
  FNS+=("$fn")
  RESTARTS+=(0)
  LAST_STEP+=("$(trained_step)")
  echo "rlkit: started step $name (pid $!)"
}

restart_step() {  # restart_step INDEX: the same step again, in this allocation
  local i=$1
  RESTARTS[$i]=$((RESTARTS[$i] + 1))
  LAST_STEP[$i]=$(trained_step)
  export RLKIT_STEP_RETRY=${RESTARTS[$i]}
  "${FNS[$i]}" &
  PIDS[$i]=$!
  echo "rlkit: restarted step ${NAMES[$i]} (retry ${RESTARTS[$i]} of $RETRIES, pid $!)"
}

trainer_status() {  # the trainer's status in progress.json (running, finished, requeue, stopped, failed: ...)
  sed -n 's/^ *"status": "\([^"]*\)".*/\1/p' progress.json 2>/dev/null | head -n 1
}

trained_step() {  # the trainer's last finished step, from progress.json (-1 when there is none yet)
  local step
  step=$(sed -n 's/^ *"step": \([0-9]*\).*/\1/p' progress.json 2>/dev/null | head -n 1)
  echo "${step:--1}"
}

component_ids() {  # "GROUP JOB_ID" per component: a heterogeneous job's components, else the job itself
  local name found=0
  for name in $(compgen -A variable SLURM_JOB_ID_HET_GROUP_); do
    echo "${name##*_} ${!name}"
    found=1
  done
  if [ "$found" -eq 0 ]; then
    echo "0 $SLURM_JOB_ID"
  fi
}

stop_steps() {  # TERM every step (gracefully, through slurmctld), give them time, then force the rest
  local pid group id running waited=0
  while read -r group id; do
    scancel --ctld --signal=TERM "$id" 2>/dev/null
  done < <(component_ids)
  while [ "$waited" -lt "$STOP_GRACE" ]; do
    running=0
    for pid in "${PIDS[@]}"; do
      [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && running=1
    done
    [ "$running" -eq 0 ] && break
    sleep 1
    waited=$((waited + 1))
  done
  for pid in "${PIDS[@]}"; do
    [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null
  done
  wait
}

on_signal() {
  echo "rlkit: batch script received $1; stopping all steps"
  stop_steps
  exit 143
}
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

on_time_limit() {  # Slurm's warning before the time limit (--signal=B:USR1@...): the trainer checkpoints and stops
  echo "rlkit: time limit near (USR1); asking the trainer to checkpoint and stop"
  local group id
  while read -r group id; do
    if [ "$group" -eq "$TRAINER_GROUP" ]; then
      scancel --ctld --signal=USR1 "$id" 2>/dev/null
    fi
  done < <(component_ids)
}
trap on_time_limit USR1

supervise() {  # wait until the job is done: returns 0 when the last non-server step succeeded
  local i pid rc name role busy
  while true; do
    busy=0
    for i in "${!PIDS[@]}"; do
      pid=${PIDS[$i]}
      [ -z "$pid" ] && continue
      if kill -0 "$pid" 2>/dev/null; then
        [ "${ROLES[$i]}" != server ] && busy=1
        continue
      fi
      wait "$pid"
      rc=$?
      name=${NAMES[$i]}
      role=${ROLES[$i]}
      PIDS[$i]=""
      if [ "$role" = trainer ] && [ "$rc" -eq 0 ] && [ "$(trainer_status)" = @STATUS_REQUEUE@ ]; then
        if [ "${SLURM_RESTART_COUNT:-0}" -lt "$RETRIES" ]; then
          echo "rlkit: the trainer checkpointed before the time limit; requeueing the job" \
            "(requeue $((${SLURM_RESTART_COUNT:-0} + 1)) of $RETRIES)"
          stop_steps
          scontrol requeue "$SLURM_JOB_ID"
          return 0
        fi
        echo "rlkit: the trainer checkpointed before the time limit, but the job was requeued $RETRIES times" \
          "already; not requeueing (rlkit resume continues it)"
        stop_steps
        return @EXIT_REQUEUE@
      fi
      if [ "$role" = trainer ] && [ "$rc" -eq 0 ] && [ "$(trainer_status)" = @STATUS_STOPPED@ ]; then
        echo "rlkit: the trainer checkpointed and stopped on request; stopping the servers"
        stop_steps
        # A stopped job ends CANCELLED, never COMPLETED: status must not call it finished and an afterok
        # dependent (the next stage) must not start, whichever of this line and `rlkit stop`'s scancel comes first.
        scancel "$SLURM_JOB_ID"
        return 0
      fi
      if [ "$rc" -eq "$NO_RETRY_EXIT" ]; then
        echo "rlkit: step $name failed with exit code $rc, which a restart cannot fix (see its log); not retrying"
        echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
        stop_steps
        return "$rc"
      fi
      if [ "$rc" -ne 0 ] && [ "$role" = trainer ] && [ "${RESTARTS[$i]}" -lt "$RETRIES" ]; then
        if [ "${RESTARTS[$i]}" -gt 0 ] && [ "$(trained_step)" = "${LAST_STEP[$i]}" ]; then
          echo "rlkit: step $name failed with exit code $rc again without finishing a step since its last" \
            "restart (crash loop); not retrying"
          echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
          stop_steps
          return "$rc"
        fi
        echo "rlkit: step $name failed with exit code $rc at trained step $(trained_step); restarting it"
        restart_step "$i"
        busy=1
        continue
      fi
      if [ "$role" = server ] && [ "${RESTARTS[$i]}" -lt "$RETRIES" ]; then
        echo "rlkit: server step $name exited (code $rc) while the job was running; restarting it"
        restart_step "$i"
        continue
      fi
      if [ "$rc" -ne 0 ]; then
        echo "rlkit: step $name failed with exit code $rc; stopping the other steps"
        stop_steps
        return "$rc"
      fi
      if [ "$role" = server ]; then
        echo "rlkit: server step $name exited while the job was running; stopping the other steps"
        stop_steps
        return 1
      fi
      echo "rlkit: step $name finished"
    done
    if [ "$busy" -eq 0 ]; then
      echo "rlkit: all work steps finished; stopping the servers"
      stop_steps
      return 0
    fi
    sleep 1 &
    wait $!
  done
}
"""


# the words and codes of rlkit.step_contract, substituted in (the trainer writes the same ones)
_SUPERVISOR = (_SUPERVISOR_TEXT.replace("@STATUS_REQUEUE@", STATUS_REQUEUE).replace("@STATUS_STOPPED@", STATUS_STOPPED)
               .replace("@EXIT_REQUEUE@", str(EXIT_REQUEUE)))


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
    lines += [
        f"#SBATCH --nodes={component.nodes}",
        f"#SBATCH --ntasks-per-node={component.ntasks_per_node}",
        f"#SBATCH --cpus-per-task={component.cpus_per_task}",
        f"#SBATCH --mem={component.mem_per_node_mb}M",
    ]
    if component.gpus_per_node:
        lines.append(f"#SBATCH --gres=gpu:{component.gpus_per_node}")
    return lines


def step_command(step: Step, plan: JobPlan) -> tuple[str, ...]:
    """The full `[env ...] srun ... [apptainer exec ...] python -m rlkit ...` argv of one step."""
    srun = ["srun", *([f"--het-group={step.het_group}"] if len(plan.components) > 1 else []),
            f"--job-name={step.name}", f"--nodes={step.nodes}", f"--ntasks={step.ntasks}"]
    if step.relative_node is not None:
        srun.append(f"--relative={step.relative_node}")
    if step.gpus_per_node:
        srun.append(f"--gres=gpu:{step.gpus_per_node}")
    # --chdir=/: the step runs from a directory nobody else can write, not the trial directory the script is in, so
    # `python -m rlkit` (whose sys.path starts with the working directory) never imports a planted rlkit/ from there
    srun += [f"--cpus-per-task={step.cpus_per_task}", f"--mem={step.mem_mb}M", "--exact", "--kill-on-bad-exit=1",
             f"--output={step.log}", "--open-mode=append", "--chdir=/", *plan.srun_args]
    inner = container_argv(step.argv, container_type=plan.container_type, image=step.image,
                           apptainer_args=plan.apptainer_args, binds=plan.binds)
    env = ("env", *(f"{k}={v}" for k, v in step.env)) if step.env else ()
    return (*env, *srun, *inner)


def render_script(plan: JobPlan) -> str:
    """The sbatch script for a plan (deterministic: the same plan gives the same text)."""
    lines = ["#!/bin/bash", f"# rlkit {__version__}: trial {plan.trial_dir}", "#"]
    lines += [f"# {note}" for note in plan.notes]
    for index, component in enumerate(plan.components):
        lines += _component_lines(index, component, plan)
    lines += ["", "set -u", f"cd {shlex.quote(plan.trial_dir)} || exit 1",
              "echo \"rlkit: job $SLURM_JOB_ID on $(hostname)\""]
    lines += [f"export RLKIT_ATTEMPT={plan.attempt}  # 1 for rlkit submit, one more per rlkit resume",
              f"RETRIES={plan.retries}  # restarts of a failed trainer or server step, and self-requeues",
              f"NO_RETRY_EXIT={NO_RETRY_EXIT}  # a step's exit code for a failure a restart cannot fix",
              f"TRAINER_GROUP={plan.trainer_group}  # the component Slurm's time-limit warning goes to"]
    lines.append(_SUPERVISOR)
    for step in plan.steps:
        fn = "cmd_" + step.name.replace("-", "_")
        lines += [f"{fn}() {{", f"  {_q(step_command(step, plan))}", "}",
                  f"start_step {step.name} {step.role} {fn}"]
    lines += ["", "supervise", "status=$?", "echo \"rlkit: batch script exits with $status\"", "exit $status", ""]
    return "\n".join(lines)
