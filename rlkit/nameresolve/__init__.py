"""Name resolve: how the steps of one job (inference servers, trainer/client) find each other.

``make_name_resolve("nfs", ...)`` gives a store on the shared filesystem; ``"etcd3"`` one on an etcd v3 server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlkit.errors import ConfigError
from rlkit.nameresolve.base import (
    NameEntryExistsError,
    NameEntryNotFoundError,
    NameResolve,
    NameResolveError,
    NameResolveTimeoutError,
)
from rlkit.nameresolve.nfs import NfsNameResolve

if TYPE_CHECKING:
    from rlkit.config.schema import ExperimentConfig

__all__ = [
    "SERVERS_KEY",
    "NameEntryExistsError",
    "NameEntryNotFoundError",
    "NameResolve",
    "NameResolveError",
    "NameResolveTimeoutError",
    "NfsNameResolve",
    "make_name_resolve",
    "name_resolve_for",
    "server_key",
]

NAME_RESOLVE_TYPES = ("nfs", "etcd3")
SERVERS_KEY = "servers"  # inference servers register as servers/<index>


def server_key(index: int) -> str:
    """The name-resolve key of inference server `index`."""
    return f"{SERVERS_KEY}/{index}"


def name_resolve_for(config: ExperimentConfig) -> NameResolve:
    """The name-resolve store of a trial, as its config says."""
    nr = config.cluster.name_resolve
    return make_name_resolve(nr.type, nfs_record_root=nr.nfs_record_root, etcd3_addr=nr.etcd3_addr,
                             experiment=config.experiment_name, trial=config.trial_name)


def make_name_resolve(
    type: str,
    *,
    nfs_record_root: str = "",
    etcd3_addr: str = "",
    experiment: str,
    trial: str,
    **kw: Any,
) -> NameResolve:
    """Build the name resolve of one experiment trial; ``kw`` (e.g. ttl, heartbeat_interval) goes to the class."""
    if type == "nfs":
        if not nfs_record_root:
            raise ConfigError(
                "name_resolve.type is 'nfs' but no nfs_record_root is set",
                hint="set name_resolve.nfs_record_root to a directory on the shared filesystem",
            )
        return NfsNameResolve(nfs_record_root, experiment, trial, **kw)
    if type == "etcd3":
        if not etcd3_addr:
            raise ConfigError(
                "name_resolve.type is 'etcd3' but no etcd3_addr is set",
                hint="set name_resolve.etcd3_addr to host:port of the etcd server",
            )
        from rlkit.nameresolve.etcd import Etcd3NameResolve

        return Etcd3NameResolve(etcd3_addr, experiment, trial, **kw)
    raise ConfigError(f"unknown name_resolve.type {type!r}", hint=f"use one of: {', '.join(NAME_RESOLVE_TYPES)}")
