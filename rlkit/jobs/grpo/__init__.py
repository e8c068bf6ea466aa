"""Job type grpo: its record (job.py), its checks and its training algorithm."""
