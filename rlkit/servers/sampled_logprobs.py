"""What the log-probs the configured servers return with sampled tokens mean (`ServerBackend.sampled_logprob_meaning`),
for the trainer's mismatch check (rlkit.trainer.mismatch_step) and its behaviour log-probs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlkit.servers.backend import LogprobMeaning, backend_for

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig


def sampled_logprob_meaning(config: ExperimentConfig) -> LogprobMeaning:
    """What the configured servers return as the log-prob of a sampled token."""
    from rlkit.config.allocation import parse_allocation

    server = parse_allocation(config.allocation_mode).server
    if server is None:
        raise ValueError(f"allocation_mode {config.allocation_mode!r} has no inference servers")
    return backend_for(server.backend).sampled_logprob_meaning(config)
