"""`rlkit docs generate`: writes (or, with --check, compares) the generated pages of the docs site: the configuration
reference from the schema, the CLI reference from the Typer app and the key maps of the other seeds. One list of
pages (`generated_pages`), so the unit test and the command cannot disagree about what is generated."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rlkit.cli.console import console
from rlkit.errors import UserError

if TYPE_CHECKING:
    from typer._click import Command

docs_app = typer.Typer(no_args_is_help=True, help="The documentation site's generated pages (docs/).")
out = console()
REGENERATE = "rlkit docs generate"  # the command that makes the pages current, as failure messages name it


def default_root() -> Path:
    """The docs/ directory of the checkout rlkit is imported from (an editable install's repository)."""
    return Path(__file__).resolve().parents[2] / "docs"


def generated_pages(cli: Command) -> dict[str, str]:
    """{file relative to docs/: text} of every generated page; `cli`: the whole `rlkit` command (its reference)."""
    from rlkit.cli.cli_reference import CLI_PAGE, render_cli
    from rlkit.cli.config_reference import render_pages
    from rlkit.cli.key_maps import render_key_maps

    return {**render_pages(), CLI_PAGE: render_cli(cli), **render_key_maps()}


def stale_pages(root: Path, cli: Command) -> list[str]:
    """The generated pages that are missing under `root` or differ from what the code generates now."""
    return [name for name, text in generated_pages(cli).items() if _current_text(root / name) != text]


def _current_text(path: Path) -> str | None:
    """The page's text as it is on disk; None for a page that is missing or not readable text (rewritten)."""
    try:
        return path.read_text() if path.is_file() else None
    except (OSError, UnicodeDecodeError):
        return None


ROOT_OPT = typer.Option(None, "--root", help="The docs/ directory to write into; default: the checkout's docs/.",
                        show_default=False)
CHECK_OPT = typer.Option(False, "--check", help="Write nothing; exit 1 naming every page that is not current.")


@docs_app.command()
def generate(ctx: typer.Context, root: str | None = ROOT_OPT, check: bool = CHECK_OPT) -> None:
    """Write the configuration reference, the CLI reference and the seeds' key maps under docs/."""
    cli = ctx.find_root().command  # the whole `rlkit` app, of which this command is one
    if root is not None and not root.strip():  # a str, not a Path: typer turns '' into Path('.')
        raise UserError(f"--root {root!r} is empty, which would write the pages into the current directory",
                        hint="pass the checkout's docs/ directory, e.g. --root docs, or leave --root out")
    docs = Path(root) if root is not None else default_root()
    if not docs.is_dir():
        raise UserError(f"no docs directory at {docs}", hint="pass the checkout's docs/ directory with --root")
    if check:
        stale = stale_pages(docs, cli)
        for name in stale:
            out.print(f"not current: {docs / name}", markup=False)
        if stale:
            out.print(f"{len(stale)} generated pages are not current; run `{REGENERATE}`", markup=False)
            raise typer.Exit(1)
        out.print(f"every generated page under {docs} is current", markup=False)
        return
    pages = generated_pages(cli)
    for name, text in pages.items():
        path = docs / name
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            if _current_text(path) != text:
                path.write_text(text)
        except OSError as exc:  # a directory or a dangling link where a page goes, a read-only tree
            raise UserError(f"cannot write {path}: {exc.strerror or exc}",
                            hint="remove what is in the way, or pass another --root") from None
    out.print(f"wrote {len(pages)} generated pages under {docs}", markup=False)
