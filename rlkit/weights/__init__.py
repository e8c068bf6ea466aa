"""Moving the trainer's weights to the inference servers (disk sync) and proving the servers serve them."""

from rlkit.weights.disk import (
    MAX_SHARD_BYTES,
    ServerSync,
    check_fingerprint,
    probe_logprobs,
    read_weight_version,
    remove_old_versions,
    server_label,
    sync_all,
    sync_server,
    tied_weight_aliases,
    trainer_probe_logprobs,
    version_dir,
    weight_sync_client,
    write_weights,
)

__all__ = [
    "MAX_SHARD_BYTES",
    "ServerSync",
    "check_fingerprint",
    "probe_logprobs",
    "read_weight_version",
    "remove_old_versions",
    "server_label",
    "sync_all",
    "sync_server",
    "tied_weight_aliases",
    "trainer_probe_logprobs",
    "version_dir",
    "weight_sync_client",
    "write_weights",
]
