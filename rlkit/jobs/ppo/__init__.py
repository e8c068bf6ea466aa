"""Job type ppo: its record (job.py), and GRPO's algorithm with a critic."""
