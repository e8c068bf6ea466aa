"""Proof, after every server start and before name resolve hears of it, that the server refuses requests without the
trial token: a guard that is merely configured could still be missing (a dropped `--middleware`, an SGLang that did
not read its `--config` key, an option that opened another path), and the trainer would then send rollouts and weight
updates to a server anyone on the cluster can drive.

One request without the token to a guarded, side-effect-free route must answer 401; the same request with the token
must answer 200 (else rlkit's own clients could not use the server). Each backend names its route
(`ServerBackend.guard_probe`, e.g. vLLM's `GET /is_paused`) and what to check when it is not refused (`guard_hint`).
"""

from __future__ import annotations

from rlkit.errors import FatalStepError
from rlkit.servers.backend import ServerBackend
from rlkit.servers.health import get_statuses


class GuardCheckFailed(FatalStepError):
    """A server answered a request without the token (or refused the token): it is stopped, never registered."""


def prove_guard(base_url: str, backend: ServerBackend, token: str, *, timeout: float = 30.0) -> None:
    """Raise `GuardCheckFailed` unless `GET {base_url}{probe}` is 401 without `token` and 200 with it.

    Proxy variables are ignored (the server is on this node). The token is never put in a message.
    """
    base = base_url.rstrip("/")
    probe = backend.guard_probe
    url = f"{base}{probe}"
    bare = _get(url, "without the token", timeout)
    if bare != 401:
        raise GuardCheckFailed(
            f"the {backend.name} server at {base} answered GET {probe} without the token with HTTP {bare}, not "
            f"401: anyone who reaches its port could use it ({backend.guard_hint}); it was stopped, not registered"
        )
    with_token = _get(url, "with the token", timeout, {"Authorization": f"Bearer {token}"})
    if with_token != 200:
        raise GuardCheckFailed(
            f"the {backend.name} server at {base} answered GET {probe} with the trial token with HTTP "
            f"{with_token}, not 200: it does not accept the trial's token, so rlkit's clients could not use it; "
            "it was stopped, not registered"
        )


def _get(url: str, how: str, timeout: float, headers: dict[str, str] | None = None) -> int:
    """The status of `GET url`, the whole answer within `timeout` (rlkit.servers.health.get_statuses)."""
    status = get_statuses([url], timeout, headers=headers)[0]
    if isinstance(status, str):
        raise GuardCheckFailed(f"could not ask GET {url} {how} to check the server's token guard ({status}); "
                               "it was stopped, not registered")
    return status
