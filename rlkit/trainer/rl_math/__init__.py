"""The RL math in one place, as pure tensor functions: advantages, GAE, KL, losses, normalisation."""
