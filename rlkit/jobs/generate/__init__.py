"""Job type generate: its record (job.py) and its in-job client step."""
