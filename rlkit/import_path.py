"""A config value of the form "module.path:function" to the callable it names, with errors that say how to fix it.

Shared by every setting that names user code (`reward.fn`, agent tools, tool-call parsers), so each one reports a
missing module, a missing attribute or a non-callable in the same words. Built-in names are the caller's business:
it checks them before calling `import_callable`.
"""

from __future__ import annotations

import importlib
from typing import Any

from rlkit.errors import ConfigError


def import_callable(spec: str, *, setting: str, form: str) -> Any:
    """The callable `spec` names; ConfigError naming `setting` (e.g. "reward.fn") and the expected `form` (how it is
    called) on every mistake."""
    spec = spec.strip()
    if ":" not in spec:
        head, _, tail = spec.rpartition(".")
        example = f", e.g. '{head}:{tail}'" if head else ""
        raise ConfigError(f"{setting} '{spec}' has no ':' between the module and the function",
                          hint=f"write it as {form}{example}")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr or ":" in attr:
        raise ConfigError(f"{setting} '{spec}' is not of the form module.path:function", hint=f"write it as {form}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{setting} '{spec}': cannot import module '{module_name}': {exc}",
                          hint=f"check the module name, and that '{module_name}' is installed or its directory is on "
                               "PYTHONPATH, both here and in the job") from exc
    except Exception as exc:
        raise ConfigError(f"{setting} '{spec}': importing module '{module_name}' raised "
                          f"{type(exc).__name__}: {exc}", hint=f"fix the error in module '{module_name}'") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            defined = sorted(n for n, v in vars(module).items()
                             if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == module_name)
            raise ConfigError(f"{setting} '{spec}': module '{module_name}' has no attribute '{attr}'",
                              hint=f"name a function defined there (found: {', '.join(defined) or 'none'})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{setting} '{spec}': '{attr}' in module '{module_name}' is a {type(obj).__name__}, "
                          "not callable", hint=f"point {setting} at a function, as {form}")
    return obj
