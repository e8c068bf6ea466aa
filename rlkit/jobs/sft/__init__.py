"""Job type sft: its record (job.py), its checks, its data, loss and algorithm."""
