"""`rlkit explain KEY`: what one config key or section does, from the schema (rlkit.cli.schema_docs) and the key maps
(rlkit.cli.key_maps): help, type, default, range, its names in AReaL and the other systems, the job types that read
it. Accepts rlkit's dotted key, a bare field name (`mb_spec`), or another system's key (`data.train_batch_size`);
a typo is an error with the closest keys. Torch-free, so it answers at once on a login node."""

from __future__ import annotations

import difflib
import re

from rlkit.cli.config_reference import page_of
from rlkit.cli.key_maps import SEEDS, their_names
from rlkit.cli.schema_docs import LIST_ITEM, NOT_IN_AREAL, FieldDoc, children, schema_docs
from rlkit.errors import UserError

MAX_SHOWN = 4  # a bare name matching more keys than this lists them instead of explaining each
_INDEX = re.compile(r"\[\d*\]")


def normalise(key: str) -> str:
    """`auxiliary_models[0].name` and `auxiliary_models.name` are the schema's `auxiliary_models[].name`."""
    key = _INDEX.sub(LIST_ITEM, key.strip().strip("."))
    docs = schema_docs()
    head, dot, rest = key.partition(".")
    if dot and head in docs and f"{head}{LIST_ITEM}.{rest}" in docs:
        return f"{head}{LIST_ITEM}.{rest}"
    return key


def _field_lines(doc: FieldDoc) -> list[str]:
    facts = [doc.type]
    if doc.default:
        facts.append(f"default {doc.default}")
    if doc.range:
        facts.append(f"range {doc.range}")
    lines = [f"{doc.path}  ({', '.join(facts)})", f"  {doc.help}"]
    if doc.doc and doc.doc != doc.help:
        lines.append(f"  {doc.doc}")
    if doc.areal == NOT_IN_AREAL:
        lines.append("  AReaL: no such key")
    else:
        lines.append(f"  AReaL: {doc.areal or 'the same name'}")
    for system in SEEDS:
        names = [their for sys_name, their, _ in their_names(doc.path) if sys_name == system]
        if names:
            lines.append(f"  {system}: {', '.join(names)}")
    readers = ", ".join(doc.job_types) if doc.job_types else "every job (no job type claims it)"
    where = f"its section ({doc.path.split('.')[0]})" if "." in doc.path else "a top-level field"
    lines.append(f"  {where}, read by job types: {readers}")
    lines.append(f"  reference: docs/{page_of(doc.path)}")
    return lines


def _section_lines(doc: FieldDoc) -> list[str]:
    lines = _field_lines(doc)
    lines.append("  fields:")
    for child in children(doc.path):
        default = f" = {child.default}" if child.default else ""
        lines.append(f"    {child.path.rpartition('.')[2]}{default}  {child.help}")
    return lines


def explain_lines(key: str) -> list[str]:
    """The lines `rlkit explain KEY` prints; a UserError (exit 2) naming the closest keys for an unknown one."""
    docs = schema_docs()
    path = normalise(key)
    if path in docs:
        return _section_lines(docs[path]) if docs[path].section else _field_lines(docs[path])
    foreign = [(system, entry) for system, (entries, _, _) in SEEDS.items() for entry in entries
               if entry.their == path]
    if foreign:
        lines = []
        for system, entry in foreign:
            note = f" ({entry.note})" if entry.note else ""
            if not entry.ours:
                lines.append(f"{system}'s {entry.their}: rlkit has no such key{note}")
                continue
            lines += [f"{system}'s {entry.their} is rlkit's {entry.ours}{note}", *_field_lines(docs[entry.ours]), ""]
        return lines
    named = [doc for p, doc in docs.items() if p.rpartition(".")[2] == path]
    if len(named) == 1:
        return _field_lines(named[0]) if not named[0].section else _section_lines(named[0])
    if 1 < len(named) <= MAX_SHOWN:
        return [line for doc in named for line in [*_field_lines(doc), ""]]
    if named:
        return [f"{len(named)} keys are named {path}; explain one of them:",
                *(f"  {doc.path}  {doc.help}" for doc in named)]
    raise UserError(f"unknown config key '{key}'", hint=_suggestion(path))


def _suggestion(path: str) -> str:
    """The closest keys (rlkit's dotted ones, bare names and the other systems' keys)."""
    docs = schema_docs()
    candidates = {p: p for p in docs}
    candidates.update({p.rpartition(".")[2]: p for p in docs})
    candidates.update({e.their: e.their for entries, _, _ in SEEDS.values() for e in entries})
    close = difflib.get_close_matches(path, list(candidates), n=3, cutoff=0.6)
    if not close:
        return "`rlkit explain SECTION` lists a section's keys (e.g. `rlkit explain actor`); docs/reference/config"
    names = list(dict.fromkeys(candidates[c] for c in close))
    return "did you mean " + " or ".join(f"'{name}'" for name in names) + "?"
