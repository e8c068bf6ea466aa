"""The configuration reference generated from the schema: every field has a help text and appears on its page with
its default, the committed pages are what the code generates now, and the AReaL names and job types are read right."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from rlkit.cli.config_reference import page_of, render_pages
from rlkit.cli.docs_cmd import REGENERATE, generated_pages, stale_pages
from rlkit.cli.main import app
from rlkit.cli.schema_docs import NOT_IN_AREAL, schema_docs
from rlkit.config.schema.walk import schema_paths
from rlkit.errors import UserError
from tests.conftest import REPO, run_rlkit

DOCS = REPO / "docs"
CLI = typer.main.get_command(app)


def test_every_schema_field_has_a_help_text() -> None:
    """A field declared without `_f(..., help)` (or with an empty one) has no line in the reference: refused here."""
    docs = schema_docs()
    assert set(schema_paths()) <= set(docs), "the walk missed fields"
    silent = [path for path, doc in docs.items() if not doc.help.strip()]
    assert not silent, f"fields without a help text (give each one in rlkit/config/schema): {silent}"


def test_every_field_is_on_its_page_with_its_default() -> None:
    pages = render_pages()
    missing = []
    for path, doc in schema_docs().items():
        page = pages["reference/config/top-level.md" if "." not in path else page_of(path)]
        row = next((line for line in page.splitlines() if line.startswith(f"| `{path}` |")
                    or line.startswith(f"| [`{path}`]")), None)
        if row is None or (doc.default and f"`{doc.default}`" not in row):
            missing.append(path)
    assert not missing, missing


def test_the_committed_pages_are_current() -> None:
    stale = stale_pages(DOCS, CLI)
    assert not stale, (f"generated pages differ from what the code generates now: {stale}; run `{REGENERATE}` "
                       "(PYTHONPATH=. python -m rlkit docs generate) and commit docs/")


def test_a_changed_help_text_makes_the_pages_stale(tmp_path: Path) -> None:
    """The check above compares real text: a page edited by hand (or a help text changed without regenerating) is
    named by `rlkit docs generate --check`, which exits 1; `generate` then makes it current again."""
    root = tmp_path / "docs"
    shutil.copytree(DOCS, root)
    actor = root / "reference" / "config" / "actor.md"
    actor.write_text(actor.read_text().replace("Clip range of the policy ratio", "Clip range"))
    runner = CliRunner()
    checked = runner.invoke(app, ["docs", "generate", "--check", "--root", str(root)])
    assert checked.exit_code == 1, checked.output
    assert "reference/config/actor.md" in checked.output and REGENERATE in checked.output
    assert runner.invoke(app, ["docs", "generate", "--root", str(root)]).exit_code == 0
    assert stale_pages(root, CLI) == []
    assert actor.read_text() == generated_pages(CLI)["reference/config/actor.md"]
    (root / "reference" / "cli.md").write_bytes(b"\xff\xfe not text")  # stale, not a UnicodeDecodeError
    assert stale_pages(root, CLI) == ["reference/cli.md"]
    (root / "reference" / "cli.md").unlink()
    (root / "reference" / "cli.md").mkdir()  # in the way of a page: exit 2 naming it, not IsADirectoryError
    blocked = runner.invoke(app, ["docs", "generate", "--root", str(root)])
    assert blocked.exit_code != 0 and isinstance(blocked.exception, UserError), blocked.output
    assert "cannot write" in str(blocked.exception) and "cli.md" in str(blocked.exception)


def test_an_empty_root_is_refused_not_read_as_the_current_directory(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """typer reads `--root ''` as Path('.'): the pages were written into the current directory."""
    monkeypatch.chdir(tmp_path)
    result = run_rlkit("docs", "generate", "--root", "")
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "--root '' is empty, which would write the pages into the current directory" in result.stderr
    assert "fix: pass the checkout's docs/ directory" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_facts_of_some_fields() -> None:
    docs = schema_docs()
    eps = docs["actor.eps_clip"]
    assert (eps.type, eps.default, eps.range, eps.areal) == ("number", "0.2", ">= 0", "")
    assert docs["critic.optimizer.lr"].default == "1e-05", "the critic's own default, not the optimizer class's"
    assert docs["experiment_name"].default == "required"
    assert docs["actor.reward_norm"].type == "section or null"
    assert docs["dpo.beta"].areal in ("beta", "actor.beta")
    assert docs["evaluator.eval_on_startup"].areal == "evaluator.eval_before_train"
    assert docs["rollout.agent.tool_call_parser"].areal == ""
    assert docs["rollout.agent.max_turns"].areal == NOT_IN_AREAL
    assert docs["auxiliary_models[].model_path"].areal == NOT_IN_AREAL
    assert docs["critic.path"].job_types == ("ppo",)
    assert docs["dpo.beta"].job_types == ("dpo",)
    assert "generate" in docs["vllm.max_num_seqs"].job_types and "sft" not in docs["vllm.max_num_seqs"].job_types
    assert docs["ref.path"].job_types == ("grpo", "ppo", "opmd", "dpo", "distill")
    assert docs["cluster.fileroot"].job_types == ()


def test_every_top_level_section_has_a_page() -> None:
    sections = [path for path, doc in schema_docs().items() if doc.section and "." not in path]
    pages = render_pages()
    assert all(f"reference/config/{section}.md" in pages for section in sections)
    index = pages["reference/config/index.md"]
    assert all(f"({section}.md)" in index for section in sections)


def test_every_generated_page_is_in_the_site_navigation() -> None:
    """mkdocs.yml's nav is written by hand: a new config section's page must be added to it, or the site hides it."""
    nav = (REPO / "mkdocs.yml").read_text()
    missing = sorted(name for name in render_pages() if f": {name}\n" not in nav)
    assert not missing, f"add these pages to mkdocs.yml's nav (Reference): {missing}"
