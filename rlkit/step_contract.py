"""What the job script's supervisor (rlkit.launch.render) and a training step tell each other, in one place.

The trainer reports through its step_state file in the trial directory (its last finished step and its status, one
per line: plain text a shell reads with `read`, not JSON) and through its exit code; the supervisor
(rlkit/launch/supervisor.sh) reads both to decide between requeueing the job, ending it, restarting the step or
failing. Both sides take the words and numbers from here (the rendered script gets them substituted in), so neither
can drift.
"""

from __future__ import annotations

STATUS_REQUEUE = "requeue"  # checkpointed on Slurm's time-limit warning (USR1): the script requeues the job
STATUS_STOPPED = "stopped"  # checkpointed on `rlkit stop` (USR2): the script ends the job
STATUS_FINISHED = "finished"  # progress.json's once the trainer has trained its last step (`rlkit stop` waits then)

EXIT_REQUEUE = 75  # the trainer's decision on USR1 (sysexits EX_TEMPFAIL); also the script's exit when out of requeues
EXIT_STOPPED = 76  # the trainer's decision on USR2
EXIT_FAILING = 77  # the algorithm cannot go on after a finished step (e.g. no server left): checkpoint it, then fail
STEP_STATE = "step_state"  # in the trial directory, written with progress.json
# Written by the job script as it exits (job id, end state, exit code, epoch seconds; one per line): how a trial
# ended once Slurm has forgotten its job (MinJobAge) and no sacct answers. Not written when the job is requeued.
JOB_END = "job_end"
JOB_END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")

NODE_CHECK_STEP = "node-check"  # step 0 of every job (rlkit.steps.node_check; log: logs/node-check.log)
NODE_CHECK_ADDRESS_MARK = "rlkit-node-check-address"  # starts the line step 0's listener prints for the batch script
SLICE_MARK = "rlkit step slice:"  # starts the line each step prints first: its node and GPUs (rlkit status reads it)
NO_RETRY_EXIT = 78  # sysexits' EX_CONFIG: a failure a restart of the step cannot fix; the supervisor never retries it


def step_state_text(step: int, status: str) -> str:
    """The step_state file's text: the step, then the status on one line (an error text may hold newlines)."""
    return f"{int(step)}\n{' '.join(status.split())}\n"
