"""The configuration reference: one markdown page per top-level section of the schema, every field with its type,
default, range, AReaL name and help text, generated from the schema (rlkit.cli.schema_docs) so that the pages cannot
drift from the code. `rlkit docs generate` writes them; a unit test fails when the committed pages differ."""

from __future__ import annotations

from rlkit.cli.schema_docs import NOT_IN_AREAL, FieldDoc, children, schema_docs

CONFIG_DIR = "reference/config"  # under docs/
TOP_LEVEL = "top-level"  # the page of the fields outside every section
GENERATED = ("<!-- generated from rlkit/config/schema by `rlkit docs generate`: edit the help texts there, not this "
             "page -->")
HEADER = "| Key | Type | Default | Range | AReaL | Meaning |\n|---|---|---|---|---|---|"


def page_name(section: str) -> str:
    """The file (relative to docs/) of a top-level section's page."""
    return f"{CONFIG_DIR}/{section or TOP_LEVEL}.md"


def page_of(path: str) -> str:
    """The page (relative to docs/) a field or section is documented on."""
    top = path.split(".")[0].removesuffix("[]")
    return page_name(top if schema_docs()[top].section else "")


def cell(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


def _areal(doc: FieldDoc) -> str:
    if doc.areal == NOT_IN_AREAL:
        return "—"
    return f"`{doc.areal}`" if doc.areal else "same"


def _row(doc: FieldDoc) -> str:
    if doc.section:  # a top-level section has a page of its own, a nested one a heading on its section's page
        key = f"[`{doc.path}`]({doc.path}.md)" if doc.path in top_sections() else f"[`{doc.path}`](#{anchor(doc.path)})"
    else:
        key = f"`{doc.path}`"
    default = f"`{doc.default}`" if doc.default else ""
    return (f"| {key} | {cell(doc.type)} | {cell(default)} | {cell(doc.range)} | {_areal(doc)} | "
            f"{cell(doc.help)} |")


def anchor(path: str) -> str:
    """The heading id mkdocs gives a section's `## path` heading (its toc slug: lower case, dots and brackets out)."""
    return "".join(c for c in path.lower() if c.isalnum() or c in "_-")


def _table(section: str) -> str:
    return HEADER + "\n" + "\n".join(_row(doc) for doc in children(section))


def _sections_under(section: str) -> list[FieldDoc]:
    """The nested sections of a section, depth first (each gets its own heading and table)."""
    found = []
    for doc in children(section):
        if doc.section:
            found.append(doc)
            found.extend(_sections_under(doc.path))
    return found


def _readers(doc: FieldDoc) -> str:
    if not doc.job_types:
        return "Read for every job (no job type claims it: the launcher and every step read it)."
    return (f"Read by the job types {', '.join(doc.job_types)} (the job types whose config sections, "
            "`rlkit.jobs`, include it; a field's help names the job types when only some of them use it).")


def render_section(section: str) -> str:
    """The markdown page of one top-level section (`""`: the top-level fields)."""
    if not section:
        lines = ["# Top-level fields", "", GENERATED, "",
                 "The fields outside every section: the trial's names, its job type, the GPU layout and the length "
                 "of training. Each section has a page of its own (see the [index](index.md)).", "",
                 _readers_top(), "", _table("")]
        return "\n".join(lines) + "\n"
    doc = schema_docs()[section]
    lines = [f"# `{section}`", "", GENERATED, "", doc.doc, "", _readers(doc), "", _table(section)]
    for sub in _sections_under(section):
        lines += ["", f"## `{sub.path}`", "", sub.doc or sub.help, "", _table(sub.path)]
    return "\n".join(lines) + "\n"


def _readers_top() -> str:
    return ("Read for every job, except where a field's help names the job types (the training length, for "
            "instance, is read by the trainers only).")


def top_sections() -> list[str]:
    """The top-level sections, in the schema's order."""
    return [doc.path for doc in children("") if doc.section]


def render_index() -> str:
    """The reference's first page: every section with its one-line help and how to read the tables."""
    lines = ["# Configuration reference", "", GENERATED, "",
             "Every field of rlkit's experiment YAML, generated from the schema (`rlkit/config/schema/`). Each "
             "page is one top-level section; nested sections have a heading and table of their own.", "",
             "- **Key**: the dotted path, as written in an override (`actor.optimizer.lr=1e-6`).",
             "- **Type**, **Default**: `required` has no default; `null` is YAML's none.",
             "- **Range**: the bounds `rlkit submit` enforces (outside them the config is refused with a fix).",
             "- **AReaL**: `same` where AReaL uses this name, AReaL's own name where it differs, `—` where AReaL "
             "has no such key.",
             "- `rlkit explain KEY` prints the same for one key or section, with the other seeds' names "
             "(Trinity-RFT, cosmos-rl, ChatLearn, verl).", "",
             "| Section | What it holds |", "|---|---|",
             f"| [top-level fields]({TOP_LEVEL}.md) | The trial's names, job type, GPU layout, training length. |"]
    for section in top_sections():
        lines.append(f"| [`{section}`]({section}.md) | {cell(schema_docs()[section].help)} |")
    return "\n".join(lines) + "\n"


def render_pages() -> dict[str, str]:
    """{file relative to docs/: text} of every page of the configuration reference."""
    pages = {f"{CONFIG_DIR}/index.md": render_index(), page_name(""): render_section("")}
    for section in top_sections():
        pages[page_name(section)] = render_section(section)
    return pages
