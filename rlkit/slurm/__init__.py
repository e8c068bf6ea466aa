"""What Slurm tells a step (its job environment, hostlists) and Slurm's time format; pure and torch-free."""
