"""Command line of an SGLang server (`python -m sglang.launch_server`).

Run for real with SGLang 0.5.23 on the CPU (tests/integration/test_sglang_backend.py, through
rlkit.servers.sglang.backend, with a test-only kernel shim): SGLang read the key from the `--config` file, answered
401 without it and 200 with it. What follows was first written from SGLang's source; the 0.5.23 run confirmed it.

How the token is enforced there. SGLang has no `--middleware` option, so `rlkit.servers.auth.TokenGuard` cannot be
put in front of it. SGLang's own `--api-key` is the guard instead. Read in SGLang's source (recent main:
`python/sglang/srt/utils/auth.py`, `entrypoints/http_server.py`; not run here): with `--api-key` set, an ASGI
middleware checks every route, accepting `Authorization: Bearer <key>` or `x-api-key: <key>`, and leaves open only
OPTIONS requests and paths starting with `/health`, `/ready` or `/metrics`. The weight routes
(`/update_weights_from_disk`, `/update_weights_from_ipc`, ...) are "admin optional": they take the api key when no
`--admin-api-key` is set. Routes marked "admin force" answer 403 unless `--admin-api-key` is set and given. Older
SGLang releases had a simpler middleware that also guarded every path except `/health...` (and `/metrics`).

How the key gets there. SGLang takes it only as an argument (no environment variable: the `SGLANG_API_KEY` found in
public code is read by clients, not by the server), and argv is readable by every local user in /proc/<pid>/cmdline.
So rlkit writes the trial token into a 0600 YAML file and passes `--config FILE`; `sglang_command` refuses `config`,
`api_key` and `admin_api_key` (and every other option rlkit.servers.extra_args refuses) in `extra`. Verified by
reading sgl-project/sglang, not by running SGLang:
- `python/sglang/srt/server_args.py` @ 001067fffe33 (`prepare_server_args`): when `--config` is in argv,
  `ConfigArgumentMerger(parser).merge_config_with_args(argv)` runs before `parser.parse_args`. ServerArgs' field
  `api_key` ("Set API key of the server") gets its flag from `arg_groups/arg_utils.py` @ 0116c6066d6e
  (`_field_to_cli_name`: `"--" + name.replace("_", "-")`), i.e. `--api-key`, with no underscore alias.
- the merger (`python/sglang/srt/utils/server_args_config_parser.py` @ 7ef0fc265d6d; the same in the older
  `python/sglang/srt/server_args_config_parser.py` @ 03bd2f167a3b and @ 06c48ca8da0b): the file must end in .yaml or
  .yml, is read with `yaml.safe_load`, must be a mapping, and each key becomes `--{key}` as written (dashes are not
  added). So the key is spelled `api-key` (`api_key` would become `--api_key`, which the parser does not know); the
  value is passed as `str(value)`. The file's arguments go before the command line's, so an option given on the
  command line wins (argparse keeps the last): the reason `config` and `api_key` must never come from `extra`. Only
  one `--config` is allowed ("Multiple config files specified!").
SGLang releases without `--config` (before the merger existed) exit at argparse, so the server fails closed. Whether
the key is in force is proven at run time by rlkit.servers.guard_check (GET /v1/models must answer 401).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from rlkit.servers.extra_args import SGLANG_REFUSED
from rlkit.servers.vllm.command import render_flags

SGLANG_KEY_FIELD = "api-key"  # the key's spelling inside the --config YAML file (see the module docstring)


def sglang_command(
    *,
    python: str,
    model: str,
    host: str,
    port: int,
    served_model_name: str | None,
    tensor_parallel_size: int,
    key_file: str,
    extra: dict[str, object],
) -> list[str]:
    """The argv of an SGLang server: `python -m sglang.launch_server --model-path M --host H --port P --tp-size T
    --config KEY_FILE`, where `key_file` is the 0600 YAML file holding the api key (`write_key_file`).

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
        "--config", key_file,
    ]  # fmt: skip
    if served_model_name:
        cmd += ["--served-model-name", served_model_name]
    cmd += render_flags(extra, reserved=SGLANG_REFUSED)
    return cmd


def write_key_file(path: Path, token: str) -> Path:
    """Write `api-key: <token>` as a YAML file only the owner can read (created 0600, never world-readable)."""
    if not token:
        raise ValueError("an empty api key would leave the SGLang server open to everyone; generate a token")
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"SGLang reads --config files ending in .yaml or .yml only, not {path.name}")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # O_CREAT's mode does not apply to a file that already existed
        f.write(f"{SGLANG_KEY_FIELD}: {json.dumps(token)}\n")
    return path
