"""One TLS context for every HTTP client rlkit makes of its own (server calls, health probes, the rollout's pool).

httpx builds a fresh context for each client, loading the CA bundle: ~50 ms of CPU, spent again by every weight
push, health probe and `rlkit status` that opened a client (a tenth of a CPU trainer rank's work was this). An
SSLContext is meant to be shared between connections and threads; this one is built as httpx builds its default for
a client with `trust_env=False` (certifi's bundle, no SSL_CERT_* variables), so what is verified does not change.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def shared_tls() -> ssl.SSLContext:
    return httpx.create_ssl_context(trust_env=False)
