"""What the job script's supervisor (rlkit.launch.render) and a training step tell each other, in one place.

The trainer reports through its step_state file in the trial directory (its last finished step and its status, one
per line: plain text a shell reads with `read`, not JSON) and through its exit code; the supervisor
(rlkit/launch/supervisor.sh) reads both to decide between requeueing the job, ending it, restarting the step or
failing. Both sides take the words and numbers from here (the rendered script gets them substituted in), so neither
can drift.
"""

from __future__ import annotations

from collections.abc import Mapping

STATUS_REQUEUE = "requeue"  # checkpointed on Slurm's time-limit warning (USR1): the script requeues the job
STATUS_STOPPED = "stopped"  # checkpointed on `rlkit stop` (USR2): the script ends the job
STATUS_FINISHED = "finished"  # progress.json's once the trainer has trained its last step (`rlkit stop` waits then)

EXIT_REQUEUE = 75  # the trainer's decision on USR1 (sysexits EX_TEMPFAIL); also the script's exit when out of requeues
EXIT_STOPPED = 76  # the trainer's decision on USR2
EXIT_FAILING = 77  # the algorithm cannot go on after a finished step (e.g. no server left): checkpoint it, then fail
STEP_STATE = "step_state"  # in the trial directory, written with progress.json
# In the trial directory, rewritten by the trainer's rank 0 the moment a USR1/USR2 reaches its Python code: `rlkit
# stop` waits STOP_ANSWER_S for it to change, and cancels at once when it does not (the trainer cannot answer).
STOP_ACK = "stop_ack"
STOP_ANSWER_S = 60.0
# Written by the job script as it exits (job id, end state, exit code, epoch seconds; one per line): how a trial
# ended once Slurm has forgotten its job (MinJobAge) and no sacct answers. Not written when the job is requeued.
JOB_END = "job_end"
JOB_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
JOB_LOCK = "job.lock"  # in the trial directory: held (flock) by the job script that runs the trial, and naming it

NODE_CHECK_STEP = "node-check"  # step 0 of every job (rlkit.steps.node_check; log: logs/node-check.log)
NODE_CHECK_ADDRESS_MARK = "rlkit-node-check-address"  # starts the line step 0's listener prints for the batch script
SLICE_MARK = "rlkit step slice:"  # starts the line each step prints first: its node and GPUs (rlkit status reads it)
NO_RETRY_EXIT = 78  # sysexits' EX_CONFIG: a failure a restart of the step cannot fix; the supervisor never retries it
# The line a step's process prints as it exits with NO_RETRY_EXIT, followed by which run of which step it is: srun
# reports the highest exit code of a step's tasks, so the 143 of a rank srun killed after another rank's 78 would hide
# the 78; the supervisor reads this line in the step's log instead.
NO_RETRY_MARK = "rlkit: no-retry exit of run"


def no_retry_mark(environ: Mapping[str, str]) -> str | None:
    """The NO_RETRY_MARK line of this run of this step (job, requeue, restart in the job), None outside a Slurm step.
    The supervisor knows the same three numbers, so a line an earlier run of the step appended to its log never
    counts."""
    job, step = environ.get("SLURM_JOB_ID", ""), environ.get("SLURM_STEP_ID", "")
    if not job or not step:
        return None
    return (f"{NO_RETRY_MARK} {job}.{environ.get('SLURM_RESTART_COUNT') or 0}."
            f"{environ.get('RLKIT_STEP_RETRY') or 0}")


def step_state_text(step: int, status: str) -> str:
    """The step_state file's text: the step, then the status on one line (an error text may hold newlines)."""
    return f"{int(step)}\n{' '.join(status.split())}\n"
