"""The `rlkit ...` commands that README.md and the docs pages show in their bash blocks are real: each names a command
of the CLI and its options and arguments parse (click's own parser, nothing run), and every `rlkit explain KEY`
example explains its key. The generated reference (docs/reference/) is checked by test_config_reference."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from rlkit.cli.explain import explain_lines
from rlkit.cli.main import app

REPO = Path(__file__).resolve().parents[3]
BASH_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)


def _pages() -> list[Path]:
    docs = REPO / "docs"
    return [REPO / "README.md", *(page for page in sorted(docs.rglob("*.md"))
                                  if docs / "reference" not in page.parents)]


def _shown_commands() -> list[tuple[str, str]]:
    """(page, command line) for every line of a bash block that starts with `rlkit `, its comment cut off."""
    found = []
    for page in _pages():
        for block in BASH_BLOCK.findall(page.read_text()):
            for line in block.splitlines():
                if line.startswith("rlkit "):
                    found.append((str(page.relative_to(REPO)), shlex.split(line, comments=True)))
    return [(page, shlex.join(words)) for page, words in found]


COMMANDS = _shown_commands()


def test_the_pages_show_commands() -> None:
    assert len(COMMANDS) > 20
    assert any(line.startswith("rlkit explain ") for _, line in COMMANDS)


@pytest.mark.parametrize("line", ["rlkit logs try2 --bogus", "rlkit submit", "rlkit image", "rlkit nosuch x"])
def test_a_wrong_command_is_caught(line: str) -> None:
    with pytest.raises(pytest.fail.Exception):
        test_a_shown_command_parses("README.md", line)


@pytest.mark.parametrize(("page", "line"), COMMANDS, ids=[f"{page}: {line}" for page, line in COMMANDS])
def test_a_shown_command_parses(page: str, line: str) -> None:
    words = shlex.split(line)[1:]
    command = typer.main.get_command(app)  # Typer's own click: a group is what has `commands`
    path = ["rlkit"]
    while hasattr(command, "commands") and words and words[0] in command.commands:
        path.append(words[0])
        command = command.commands[words.pop(0)]
    if hasattr(command, "commands"):
        pytest.fail(f"{page}: `{line}` names no command of {' '.join(path)}")
    try:
        command.make_context(" ".join(path), list(words))
    except typer.TyperException as error:  # a usage error: an unknown option, a missing or extra argument
        pytest.fail(f"{page}: `{line}` does not parse: {error}")


@pytest.mark.parametrize("line", sorted({line for _, line in COMMANDS if line.startswith("rlkit explain ")}))
def test_a_shown_explain_example_explains_its_key(line: str) -> None:
    (key,) = shlex.split(line)[2:]
    assert explain_lines(key), line


def test_the_readme_config_renders(tmp_path: Path) -> None:
    """The README's annotated config is a whole config: `rlkit render` takes it (its site files missing here are
    warnings) and plans what its comments say."""
    from tests.conftest import run_rlkit

    (config,) = re.findall(r"^```yaml\n(.*?)^```", (REPO / "README.md").read_text(), re.S | re.M)
    path = tmp_path / "readme.yaml"
    path.write_text(config)
    done = run_rlkit("render", str(path))
    assert done.returncode == 0, done.stderr
    assert "# job type grpo" in done.stdout
    assert "4 vllm server(s) of 2 GPU(s)" in done.stdout
