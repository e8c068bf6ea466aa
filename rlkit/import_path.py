"""A config value of the form "module.path:function" to the callable it names, with errors that say how to fix it.

Shared by every setting that names user code (`reward.fn`, agent tools, tool-call parsers, episode workflows), so
each one reports a missing module, a missing attribute or a non-callable in the same words. Built-in names are the
caller's business: it checks them before calling `import_callable`. Settings whose code runs in the process that
reads them (workflows, tools, parsers) may also name a file, `/abs/path/file.py:function`; `reward.fn` may not (its
function is sent to worker processes by reference, which must import it by module name).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from rlkit.errors import ConfigError


def _module_from_file(path_text: str, spec: str, setting: str) -> ModuleType:
    """The module of a user's file (loaded once per path, under a name derived from the path)."""
    path = Path(path_text)
    if not path.is_absolute():
        raise ConfigError(f"{setting} '{spec}': the file must be given by its absolute path",
                          hint=f"e.g. {Path.cwd() / path}:{spec.rpartition(':')[2]}")
    if not path.is_file():
        raise ConfigError(f"{setting} '{spec}': {path} is not a file", hint="check the path (it must be on a "
                                                                              "filesystem the job's nodes see too)")
    name = "rlkit_user_" + hashlib.sha256(str(path).encode()).hexdigest()[:16]
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise ConfigError(f"{setting} '{spec}': {path} cannot be loaded as a Python file", hint="name a .py file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and pickling inside the file look their module up here
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a file that calls sys.exit() as it runs must not end rlkit with its code
        del sys.modules[name]
        raise ConfigError(f"{setting} '{spec}': running {path} raised {type(exc).__name__}: {exc}",
                          hint=f"fix the error in {path}") from exc
    return module


def import_callable(spec: str, *, setting: str, form: str, files: bool = False) -> Any:
    """The callable `spec` names; ConfigError naming `setting` (e.g. "reward.fn") and the expected `form` (how it is
    called) on every mistake. `files`: `spec` may also be `/abs/path/file.py:function`."""
    spec = spec.strip()
    if files and ".py:" in spec:
        path_text, _, attr = spec.rpartition(":")
        if path_text.endswith(".py"):
            return _attribute(_module_from_file(path_text, spec, setting), path_text, attr, spec, setting, form)
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
    except (Exception, SystemExit) as exc:  # SystemExit: a module that calls sys.exit() as it is imported
        raise ConfigError(f"{setting} '{spec}': importing module '{module_name}' raised "
                          f"{type(exc).__name__}: {exc}", hint=f"fix the error in module '{module_name}'") from exc
    return _attribute(module, module_name, attr, spec, setting, form)


def _attribute(module: ModuleType, module_name: str, attr: str, spec: str, setting: str, form: str) -> Any:
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            home = module.__name__
            defined = sorted(n for n, v in vars(module).items()
                             if callable(v) and not n.startswith("_") and getattr(v, "__module__", None) == home)
            raise ConfigError(f"{setting} '{spec}': module '{module_name}' has no attribute '{attr}'",
                              hint=f"name a function defined there (found: {', '.join(defined) or 'none'})")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ConfigError(f"{setting} '{spec}': '{attr}' in module '{module_name}' is a {type(obj).__name__}, "
                          "not callable", hint=f"point {setting} at a function, as {form}")
    return obj
