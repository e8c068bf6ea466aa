"""Job type rw: its record (job.py) and its algorithm (a reward model on preference pairs)."""
