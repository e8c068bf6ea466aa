"""What the job script's supervisor (rlkit.launch.render) and a training step tell each other, in one place.

The step reports through the "status" of progress.json in the trial directory and through its exit code; the
supervisor reads both to decide between requeueing the job, ending it, restarting the step or failing. Both sides
take the words and numbers from here (the rendered script gets them substituted in), so neither can drift.
"""

from __future__ import annotations

STATUS_REQUEUE = "requeue"  # checkpointed on Slurm's time-limit warning (USR1): the script requeues the job
STATUS_STOPPED = "stopped"  # checkpointed on `rlkit stop` (USR2): the script ends the job

EXIT_REQUEUE = 75  # the trainer's decision on USR1 (sysexits EX_TEMPFAIL); also the script's exit when out of requeues
EXIT_STOPPED = 76  # the trainer's decision on USR2
EXIT_SERVERS_GONE = 77  # no server reachable for a weight push: checkpoint, then fail (the in-job retry resumes)
NO_RETRY_EXIT = 78  # sysexits' EX_CONFIG: a failure a restart of the step cannot fix; the supervisor never retries it
