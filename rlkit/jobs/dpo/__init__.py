"""Job type dpo: its record (job.py) and its algorithm (DPO on preference pairs)."""
