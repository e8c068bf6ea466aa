"""The layering of rlkit's packages, read from the import graph (`ast`, lazy imports inside functions included): no
import cycle, packages import only lower layers (a few listed exceptions), config imports nothing of rlkit but errors
(and untrusted_json); and the login-node side stays light: config, checks, launch, the jobs' records and checks and
`rlkit status` never pull in torch, vLLM, transformers or the trainer (rlkit.trainer and the jobs' algorithm
modules)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from tests.conftest import REPO, grpo_as_sft

HEAVY = ("torch", "vllm", "transformers", "sglang", "safetensors", "xxhash")
REPORT = f"""
heavy = {{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r})
trainer = {{m for m in sys.modules if m == "rlkit.trainer" or m.startswith("rlkit.trainer.")
           or (m.startswith("rlkit.jobs.") and m.endswith(".algorithm"))}}
print("loaded:", " ".join(sorted(heavy | trainer)))
"""
# the jobs' records and checks: what the login node reads of a job type (its algorithm and step run in the job)
JOB_RECORDS = sorted(".".join(path.relative_to(REPO).with_suffix("").parts)
                     for pattern in ("*.py", "*/job.py", "*/checks.py")
                     for path in (REPO / "rlkit" / "jobs").glob(pattern)
                     if path.name not in ("__init__.py", "run.py"))  # run: the in-job dispatcher imports the step
PROGRAM = f"""
import pkgutil, sys
import rlkit.config, rlkit.checks, rlkit.launch
for package in (rlkit.config, rlkit.checks, rlkit.launch):
    for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
        __import__(module.name)
for name in {JOB_RECORDS!r}:
    __import__(name)
import rlkit.cli.main, rlkit.cli.status, rlkit.trials.stage_runs, rlkit.cli.status_stages
from rlkit.launch.submit import prepare
from rlkit.servers.backend import backend_for
backend_for("sglang")  # the planner and validation may ask a backend; its module stays light
for config in sys.argv[1:]:
    prepare(config, [], dry_run=True)
    print("prepared:", config)
{REPORT}"""
STATUS = f"""
import sys
import rlkit.cli.main

sys.argv = ["rlkit", "status"]
try:
    rlkit.cli.main.main()
except SystemExit as end:
    assert end.code == 0, end.code
{REPORT}"""


def test_validating_and_rendering_imports_no_heavy_package(generate_yaml: Path, grpo_yaml: Path, fake_model: Path,
                                                           tmp_path: Path) -> None:
    """Every module of config, checks and launch, and the jobs' records and checks, is imported; a generate, a grpo
    and an sft config, and the rw, dpo and ppo demo configs (their model and data made under tmp_path), are loaded,
    validated (the grpo reward function included), planned and rendered."""
    from rlkit.tasks.digits import write_dataset
    from rlkit.tasks.digits_pairs import write_pair_splits

    demo = tmp_path / "demo"
    demo.mkdir()
    (demo / "tiny-model").symlink_to(fake_model)
    write_pair_splits(demo, train=16, held_out=16)
    write_dataset(demo / "digits.jsonl", count=16)
    demos = [str(REPO / "configs" / f"{kind}-cpu-demo.yaml") for kind in ("rw", "dpo", "ppo")]
    sft_data = grpo_yaml.with_name("sft.jsonl")
    sft_data.write_text("".join(json.dumps({"prompt": f"{i}+1=", "response": str(i + 1)}) + "\n" for i in range(8)))
    sft_yaml = grpo_yaml.with_name("sft.yaml")
    sft_yaml.write_text(grpo_as_sft(grpo_yaml.read_text(), sft_data))
    env = {**os.environ, "RLKIT_DEMO_DIR": str(demo), "RLKIT_FILEROOT": str(tmp_path / "fileroot")}
    out = subprocess.run([sys.executable, "-c", PROGRAM, str(generate_yaml), str(grpo_yaml), str(sft_yaml), *demos],
                         capture_output=True, text=True, check=True, env=env)
    assert _loaded(out.stdout) == "", f"imported on the login-node path: {out.stdout}"
    assert out.stdout.count("prepared:") == 6, out.stdout


def _loaded(stdout: str) -> str:
    """What the report line names (heavy packages and rlkit.trainer modules imported)."""
    reports = [line for line in stdout.splitlines() if line.startswith("loaded:")]
    assert len(reports) == 1, stdout
    return reports[0].removeprefix("loaded:").strip()


def test_rlkit_status_imports_no_heavy_package_nor_the_trainer(rlkit_home: Path) -> None:
    """`rlkit status` (no trials recorded here) runs through the real CLI entry point."""
    out = subprocess.run([sys.executable, "-c", STATUS], capture_output=True, text=True, check=True,
                         env={**os.environ, "RLKIT_HOME": str(rlkit_home)})
    assert _loaded(out.stdout) == "", f"imported by rlkit status: {out.stdout}"


# ---- the import graph ----

# rlkit's packages, lowest layer first: a package imports only packages of lower layers (and its own modules); the
# packages of one layer are peers that do not import each other
LAYER = {
    "leaves": 0,  # rlkit/__init__.py, errors, step_contract, fsutil, import_path, types, untrusted_json, cuda_oom,
    # source_id
    "slurm": 1,
    "config": 2,
    "data": 3, "images": 3, "models": 3, "tasks": 3,
    "trials": 4,
    "nameresolve": 5,
    "servers": 6,
    "rewards": 7,
    "agent": 8,
    "rollout": 9,
    "weights": 10,
    "trainer": 11,
    "checks": 12,
    "jobs": 13,
    "steps": 14,
    "launch": 15,
    "cli": 16,
}
# the modules directly in rlkit/ and their layer's name: the leaves, and `python -m rlkit` (the CLI's entry point)
ROOT_MODULES = {"rlkit": "leaves", "rlkit.errors": "leaves", "rlkit.step_contract": "leaves", "rlkit.fsutil": "leaves",
                "rlkit.import_path": "leaves", "rlkit.types": "leaves", "rlkit.untrusted_json": "leaves",
                "rlkit.source_id": "leaves",
                "rlkit.cuda_oom": "leaves", "rlkit.__main__": "cli"}
# the runtime imports allowed to go up a layer: (importer module, imported module) -> why; at most MAX_UPWARD
ALLOWED_UPWARD: dict[tuple[str, str], str] = {}
MAX_UPWARD = 4


@dataclass(frozen=True)
class Import:
    """One import statement's edge: `importer` imports `imported` at `line`; `type_only` under `if TYPE_CHECKING:`."""

    importer: str
    imported: str
    line: int
    type_only: bool


def _where(edges: list[Import]) -> str:
    """`rlkit/x/y.py:12,40: rlkit.x.y (x, layer 3) imports rlkit.z (z, layer 5)`: one importer, one imported module."""
    first = edges[0]
    path, lines = _modules()[first.importer].relative_to(REPO), ",".join(str(edge.line) for edge in edges)
    return (f"{path}:{lines}: {first.importer} ({_describe(first.importer)}) imports {first.imported} "
            f"({_describe(first.imported)})")


@cache
def _modules() -> dict[str, Path]:
    """{dotted module name: file} of every module under rlkit/ (a package is its __init__.py)."""
    modules = {}
    for path in sorted((REPO / "rlkit").rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _package(module: str) -> str | None:
    """The layer-table name of a module's package (None: a module directly in rlkit/ the table does not place)."""
    if module in ROOT_MODULES:
        return ROOT_MODULES[module]
    name = module.split(".")[1]
    return name if (REPO / "rlkit" / name).is_dir() else None


def _describe(module: str) -> str:
    """`config, layer 2`: a module's package and its layer, for failure messages."""
    package = _package(module)
    return f"{package}, layer {LAYER[package]}" if package in LAYER else f"{package or module}, no layer"


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The rlkit modules an import statement loads: the deepest existing module a dotted name names; for
    `from package import name`, the submodule when `name` is one, else the package."""
    known = _modules()
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:  # relative: `.` is the importing module's package, each further dot one package up
            package = module.split(".") if known[module].name == "__init__.py" else module.split(".")[:-1]
            base = ".".join([*package[:len(package) - node.level + 1], *([base] if base else [])])
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    found = []
    for name in names:
        while name and name not in known:
            name = name.rpartition(".")[0]
        # importing a.b.c runs the __init__.py of a.b first: a package the importer does not already sit in counts
        parents = [".".join(name.split(".")[:i]) for i in range(2, name.count(".") + 1)]
        for target in [*parents, name]:
            if target and target != module and not module.startswith(target + ".") and target not in found:
                found.append(target)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


@cache
def _imports() -> tuple[Import, ...]:
    """Every import of an rlkit module by an rlkit module, lazy ones (inside functions) included."""
    found: list[Import] = []

    def visit(node: ast.AST, module: str, type_only: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for statement in node.body:
                visit(statement, module, True)
            for statement in node.orelse:
                visit(statement, module, type_only)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.extend(Import(module, target, node.lineno, type_only) for target in _targets(node, module))
        for child in ast.iter_child_nodes(node):
            visit(child, module, type_only)

    for module, path in _modules().items():
        visit(ast.parse(path.read_text(), str(path)), module, False)
    return tuple(found)


def _upward(imports: tuple[Import, ...] | None = None) -> dict[tuple[str, str], list[Import]]:
    """The runtime imports of a module in another package that is not in a lower layer (a higher one, or a peer of
    the same layer), by (importer, imported); of rlkit's own imports unless `imports` are given."""
    upward: dict[tuple[str, str], list[Import]] = {}
    for edge in _imports() if imports is None else imports:
        low, high = _package(edge.importer), _package(edge.imported)
        if not edge.type_only and low in LAYER and high in LAYER and low != high and LAYER[high] >= LAYER[low]:
            upward.setdefault((edge.importer, edge.imported), []).append(edge)
    return upward


def _cycles(imports: tuple[Import, ...] | None = None) -> list[list[Import]]:
    """One cycle per strongly connected group of modules (all imports, type-only included), as its edges; of rlkit's
    own imports unless `imports` are given."""
    graph: dict[str, dict[str, Import]] = {}
    for edge in _imports() if imports is None else imports:
        graph.setdefault(edge.importer, {}).setdefault(edge.imported, edge)
    reach = {module: _reachable(graph, module) for module in graph}
    cycles, seen = [], set()
    for module in sorted(graph):
        if module in seen or module not in reach[module]:
            continue
        seen |= {other for other in reach[module] if module in reach.get(other, ())}
        cycles.append(_shortest_cycle(graph, module))
    return cycles


def _reachable(graph: dict[str, dict[str, Import]], start: str) -> set[str]:
    reached, todo = set(), [start]
    while todo:
        for target in graph.get(todo.pop(), {}):
            if target not in reached:
                reached.add(target)
                todo.append(target)
    return reached


def _shortest_cycle(graph: dict[str, dict[str, Import]], start: str) -> list[Import]:
    """The fewest imports leading from `start` back to itself (breadth first)."""
    came_by: dict[str, Import] = {}  # module -> the import that first reached it
    frontier = [start]
    while start not in came_by:
        reached = []
        for module in frontier:
            for target, edge in graph.get(module, {}).items():
                if target not in came_by:
                    came_by[target] = edge
                    reached.append(target)
        frontier = reached
    path = [came_by[start]]
    while path[0].importer != start:
        path.insert(0, came_by[path[0].importer])
    return path


def test_every_module_belongs_to_a_layer() -> None:
    """A new package or a new module directly in rlkit/ is placed in the table before anything holds it."""
    unplaced = sorted(module for module in _modules() if _package(module) not in LAYER)
    assert not unplaced, f"modules whose package has no layer in LAYER (test_layering.py): {unplaced}"


def test_no_import_cycle() -> None:
    """No module imports itself through others, counting every import: lazy and type-only ones too."""
    cycles = _cycles()
    assert not cycles, f"{len(cycles)} import cycle(s), one shortest cycle each:\n" + "\n\n".join(
        "\n".join(_where([edge]) for edge in cycle) for cycle in cycles)


def test_packages_import_only_lower_layers() -> None:
    """A runtime import of a higher layer's module is refused unless ALLOWED_UPWARD lists it with its reason."""
    refused = [_where(edges) for pair, edges in sorted(_upward().items()) if pair not in ALLOWED_UPWARD]
    assert not refused, f"{len(refused)} upward import(s) not in ALLOWED_UPWARD:\n" + "\n".join(refused)


def test_every_allowed_upward_import_still_exists_and_they_are_few() -> None:
    """The allowed list only shrinks: an exception the code no longer has is taken off it."""
    gone = sorted(set(ALLOWED_UPWARD) - set(_upward()))
    assert not gone, f"allowed upward imports that no longer exist (remove them from ALLOWED_UPWARD): {gone}"
    assert len(ALLOWED_UPWARD) <= MAX_UPWARD, f"at most {MAX_UPWARD} upward imports: {sorted(ALLOWED_UPWARD)}"


def test_config_imports_nothing_of_rlkit_but_errors() -> None:
    """config is the torch-free leaf everything reads: at run time it needs only rlkit.errors (and
    rlkit.untrusted_json, json.loads for the model directories it reads)."""
    outside = [_where([edge]) for edge in _imports() if _package(edge.importer) == "config" and not edge.type_only
               and _package(edge.imported) != "config"
               and edge.imported not in ("rlkit.errors", "rlkit.untrusted_json")]
    assert not outside, "config imports other rlkit modules at run time:\n" + "\n".join(outside)


def test_the_graph_checks_see_what_they_must_refuse() -> None:
    """The checks above fail on a made-up graph: a type-only cycle, an upward import from a lazy or relative import,
    and a parent package run by an import. (Imports by string, such as a job type's "module:function" step or a
    registry's module names, are not edges: they run in the job, after the login-node side.)"""
    made_up = (Import("rlkit.rollout.groups", "rlkit.rollout.controller", 1, True),
               Import("rlkit.rollout.controller", "rlkit.rollout.groups", 2, False),
               Import("rlkit.config.load", "rlkit.trainer.loop", 3, False))
    assert [[edge.line for edge in cycle] for cycle in _cycles(made_up)] == [[2, 1]]
    assert list(_upward(made_up)) == [("rlkit.config.load", "rlkit.trainer.loop")]
    lazy = ast.parse("def f():\n    from ..trainer import loop\n").body[0].body[0]
    assert _targets(lazy, "rlkit.config.load") == ["rlkit.trainer", "rlkit.trainer.loop"]
    assert _targets(ast.parse("import rlkit.jobs.base as b").body[0], "rlkit.checks.layout") == [
        "rlkit.jobs", "rlkit.jobs.base"]
    assert _targets(ast.parse("from rlkit.jobs.base import JobType").body[0], "rlkit.jobs.registry") == [
        "rlkit.jobs.base"]
