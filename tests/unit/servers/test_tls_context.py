"""Every HTTP client rlkit opens shares one TLS context (rlkit.servers.tls): httpx otherwise builds one, loading the
CA bundle (~50 ms of CPU), for each client, and a trainer opens clients for every push, fingerprint and probe."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest


def test_opening_clients_and_probing_health_builds_one_tls_context(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlkit.servers import tls
    from rlkit.servers.health import answers_health, find_free_port
    from rlkit.servers.http import server_client

    built: list[int] = []
    real = ssl.create_default_context

    def counting(*args: Any, **kwargs: Any) -> ssl.SSLContext:
        built.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counting)
    tls.shared_tls.cache_clear()
    try:
        clients = [server_client("token") for _ in range(3)]
        assert not answers_health(f"127.0.0.1:{find_free_port()}", timeout=1.0)  # nothing listens: refused
        assert not answers_health(f"127.0.0.1:{find_free_port()}", timeout=1.0)

        async def close_all() -> None:
            await asyncio.gather(*(c.aclose() for c in clients))

        asyncio.run(close_all())
        assert len(built) == 1, f"{len(built)} TLS contexts built for 3 clients and 2 health probes"
    finally:
        tls.shared_tls.cache_clear()  # the next user builds the real one again
