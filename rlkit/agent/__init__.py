"""Multi-turn, tool-using episodes: tool calls, the tool registry, token-exact trajectories and their metrics."""
