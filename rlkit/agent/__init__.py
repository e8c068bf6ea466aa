"""Multi-turn, tool-using agent rollouts: tools, trajectories and the sandbox the code tool runs in."""
