"""Command line of an SGLang server (`python -m sglang.launch_server`).

Rendered and unit-tested only: SGLang has no CPU wheel, so no SGLang server has run on this project's machines.

How the token is enforced there. SGLang has no `--middleware` option, so `rlkit.servers.auth.TokenGuard` cannot be
put in front of it. SGLang's own `--api-key` is the guard instead. Read in SGLang's source (recent main:
`python/sglang/srt/utils/auth.py`, `entrypoints/http_server.py`; not run here): with `--api-key` set, an ASGI
middleware checks every route, accepting `Authorization: Bearer <key>` or `x-api-key: <key>`, and leaves open only
OPTIONS requests and paths starting with `/health`, `/ready` or `/metrics`. The weight routes
(`/update_weights_from_disk`, `/update_weights_from_ipc`, ...) are "admin optional": they take the api key when no
`--admin-api-key` is set. Routes marked "admin force" answer 403 unless `--admin-api-key` is set and given. Older
SGLang releases had a simpler middleware that also guarded every path except `/health...` (and `/metrics`).

SGLang takes the key from its arguments only (no environment variable was found), and argv is readable by every
local user in /proc/<pid>/cmdline. `sglang_command` therefore refuses `api_key`/`admin_api_key` in `extra`. SGLang
also accepts `--config FILE` (a YAML file merged into the arguments inside the process), which would keep the key
off argv: give it as `extra={"config": path}` with a 0600 file. NOT verified here: whether that file's keys are
spelled `api_key` or `api-key`, and that the merged key reaches the middleware.
"""

from __future__ import annotations

from rlkit.servers.vllm import render_flags

# Set by sglang_command's own arguments (and their SGLang aliases); api keys would put a secret on argv.
_SGLANG_RESERVED = frozenset(
    {
        "model_path",
        "model",
        "host",
        "port",
        "tp_size",
        "tp",
        "tensor_parallel_size",
        "served_model_name",
        "api_key",
        "admin_api_key",
    }
)


def sglang_command(
    *,
    python: str,
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    tensor_parallel_size: int,
    extra: dict[str, object],
) -> list[str]:
    """The argv of an SGLang server: `python -m sglang.launch_server --model-path M --host H --port P --tp-size T`.

    `extra` is rendered like vLLM's extras (`render_flags`): `None` and `False` are left out (SGLang's switches
    are store_true flags; to turn off something on by default, set its `disable_*` flag to True), `True` is a bare
    flag, lists follow one flag (`--cuda-graph-bs 1 2 4`), dicts become one JSON argument.
    """
    if tensor_parallel_size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {tensor_parallel_size}")
    cmd = [
        python, "-m", "sglang.launch_server",
        "--model-path", model,
        "--host", host,
        "--port", str(port),
        "--tp-size", str(tensor_parallel_size),
    ]  # fmt: skip
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    cmd += render_flags(extra, reserved=_SGLANG_RESERVED)
    return cmd
