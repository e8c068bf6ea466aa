"""Name resolve: how the steps of one job (inference servers, trainer/client) find each other.

``make_name_resolve("nfs", ...)`` gives a store on the shared filesystem; ``"etcd3"`` one on an etcd v3 server.
NFS records of a trial live in ``<trial dir>/name_resolve/`` (the trial directory is 0700), or, when
``nfs_record_root`` is set, in ``<nfs_record_root>/<uid>/<experiment>/<trial>/`` below a 0700 directory of the user:
never where another user could write them (the trainer sends the trial's token to the addresses they name).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlkit.config.schema.experiment import NAME_RESOLVE_TYPES
from rlkit.errors import ConfigError
from rlkit.nameresolve.base import (
    NameEntryExistsError,
    NameEntryNotFoundError,
    NameResolve,
    NameResolveError,
    NameResolveTimeoutError,
)
from rlkit.nameresolve.nfs import NfsNameResolve
from rlkit.nameresolve.servers import (
    AUXILIARY_KEY,
    SERVERS_KEY,
    ServerRecord,
    auxiliary_prefix,
    check_address,
    read_servers,
    server_key,
)

if TYPE_CHECKING:
    from rlkit.config.schema.experiment import ExperimentConfig

__all__ = [
    "AUXILIARY_KEY",
    "SERVERS_KEY",
    "NameEntryExistsError",
    "NameEntryNotFoundError",
    "NameResolve",
    "NameResolveError",
    "NameResolveTimeoutError",
    "NfsNameResolve",
    "ServerRecord",
    "auxiliary_prefix",
    "check_address",
    "make_name_resolve",
    "name_resolve_for",
    "read_servers",
    "server_key",
]

def name_resolve_for(config: ExperimentConfig, **kw: Any) -> NameResolve:
    """The name-resolve store of a trial, as its config says; `kw` (ttl, heartbeat_interval) goes to the class."""
    from rlkit.trials.paths import TrialPaths

    nr = config.cluster.name_resolve
    trial_dir = TrialPaths.of(config.cluster.fileroot, config.experiment_name, config.trial_name).root
    etcd: dict[str, Any] = {}
    if nr.type == "etcd3":
        from rlkit.nameresolve.etcd import EtcdTls

        etcd = {"tls": EtcdTls(nr.etcd3_cacert, nr.etcd3_cert, nr.etcd3_key), "user": nr.etcd3_user,
                "password": os.environ.get("ETCDCTL_PASSWORD", "") if nr.etcd3_user else ""}
    return make_name_resolve(nr.type, trial_dir=trial_dir, nfs_record_root=nr.nfs_record_root,
                             etcd3_addr=nr.etcd3_addr, experiment=config.experiment_name, trial=config.trial_name,
                             **etcd, **kw)


def make_name_resolve(
    type: str,
    *,
    trial_dir: str | Path = "",
    nfs_record_root: str = "",
    etcd3_addr: str = "",
    experiment: str,
    trial: str,
    **kw: Any,
) -> NameResolve:
    """Build the name resolve of one experiment trial; ``kw`` (e.g. ttl, heartbeat_interval) goes to the class.

    NFS: records in ``<trial_dir>/name_resolve/``, or below ``<nfs_record_root>/<uid>/`` when that is set.
    """
    if type == "nfs":
        if nfs_record_root:
            return NfsNameResolve(Path(nfs_record_root) / str(os.getuid()), experiment, trial, **kw)
        if not trial_dir:
            raise ConfigError(
                "name_resolve.type is 'nfs' but neither a trial directory nor nfs_record_root is given",
                hint="leave name_resolve.nfs_record_root empty (records go into the trial directory) or set it to "
                     "a directory on the shared filesystem",
            )
        return NfsNameResolve(Path(trial_dir) / "name_resolve", **kw)
    if type == "etcd3":
        if not etcd3_addr:
            raise ConfigError(
                "name_resolve.type is 'etcd3' but no etcd3_addr is set",
                hint="set name_resolve.etcd3_addr to host:port of the etcd server",
            )
        from rlkit.nameresolve.etcd import Etcd3NameResolve

        return Etcd3NameResolve(etcd3_addr, experiment, trial, **kw)
    raise ConfigError(f"unknown name_resolve.type {type!r}", hint=f"use one of: {', '.join(NAME_RESOLVE_TYPES)}")
