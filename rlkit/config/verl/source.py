"""A verl run as `rlkit migrate` reads it: the key=value words of a shell script's `verl.trainer.main_ppo` command, or
the nested keys of a verl YAML file, as dotted keys and values.

A script is read, not run: line continuations are joined, comments dropped and quotes removed as the shell would, and
the words of the one command that runs verl.trainer.main_ppo are taken up to the first `;`, `&&`, `|` or redirection.
Values are typed as Hydra types them (`1e-6` a number, `True` a bool, `[a,b]` a list). The variables the script
itself sets before the command are expanded as bash would (rlkit.config.verl.variables says which forms); any other
`$VAR` and `${VAR}` (the environment's, a `$(...)`'s) stays as text, named for the header, `${VAR}` written `$VAR`
because `${...}` is a reference in rlkit's (OmegaConf's) YAML.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from rlkit.config.load import read_yaml
from rlkit.config.trinity_refs import resolve_references
from rlkit.config.verl.shell import logical_lines
from rlkit.config.verl.variables import Expansion, collect, expand_line
from rlkit.errors import ConfigError

SCRIPT_LIMIT = 1 << 20  # bytes of a run script read (a verl script is a few kB)
COMMAND = re.compile(r"(^|[/\s])verl[./]trainer[./]main_ppo(\.py)?$")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_\-]*(\.[A-Za-z_][A-Za-z0-9_\-]*)*")
_VARIABLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))")
_EXPONENT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_PLACEHOLDER = re.compile("\x01([0-9]+)\x02")  # a $(...) kept whole while the line is split (_words)
_SUBSTITUTION = re.compile(r"\$\(.*\)")
_ARGUMENTS = re.compile(r"\$[@*]|\$\{[@*](:[^}]*)?\}")  # the script's own arguments ("$@", "${@:2}"): dropped
_WHOLE = re.compile(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)(\[[@*]\])?\}|([A-Za-z_][A-Za-z0-9_]*))")  # $x, ${x}, ${x[@]}
# verl's own top-level sections: a YAML file holding actor_rollout_ref (no other system's), or algorithm with
# adv_estimator and none of Trinity-RFT's own sections, is verl's
VERL_SECTIONS = ("actor_rollout_ref", "algorithm", "data", "trainer", "critic", "reward_model")


@dataclass
class VerlRun:
    """The verl keys of a run and what the header says about them."""

    leaves: dict[str, Any]
    variables: dict[str, list[str]] = field(default_factory=dict)  # verl key -> the shell variables its value names
    assigned: dict[str, str] = field(default_factory=dict)  # shell variable -> its text where the script sets it
    ignored: list[str] = field(default_factory=list)  # words of the command that are not key=value
    unread: list[str] = field(default_factory=list)  # of those, a variable left unexpanded: key=value words lost
    expanded: list[Expansion] = field(default_factory=list)  # the script's variables expanded in the command


def is_verl_yaml(data: dict[str, Any]) -> bool:
    """Whether a YAML mapping is a verl config: it has actor_rollout_ref, or algorithm.adv_estimator without any of
    Trinity-RFT's own sections (Trinity-RFT has an `algorithm` section too)."""
    if isinstance(data.get("actor_rollout_ref"), dict):
        return True
    algorithm = data.get("algorithm")
    return isinstance(algorithm, dict) and "adv_estimator" in algorithm and \
        not {"synchronizer", "explorer", "buffer"} & set(data)


def script_text(path: Path) -> str | None:
    """The text of `path` when it is a verl run script (it names verl.trainer.main_ppo and is no YAML file), else
    None."""
    try:
        if path.suffix in (".yaml", ".yml", ".json") or not path.is_file() or path.stat().st_size > SCRIPT_LIMIT:
            return None
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return text if re.search(r"verl[./]trainer[./]main_ppo", text) else None


def read_yaml_run(path: Path, source: str) -> VerlRun:
    """A verl YAML file's keys, its `${...}` references (to verl's own keys) resolved as verl's Hydra resolves them."""
    resolved, _ = resolve_references(read_yaml(path), source)
    return VerlRun(dict(_leaves(resolved)))


def _leaves(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out.extend(_leaves(value, f"{prefix}{key}."))
        else:
            out.append((f"{prefix}{key}", value))
    return out


def read_script(text: str, source: str) -> VerlRun:
    """The key=value words of the script's verl.trainer.main_ppo command, the variables the script sets before it
    expanded (rlkit.config.verl.variables); ConfigError when there is not exactly one such command or it cannot be
    split into words."""
    lines = logical_lines(text[:SCRIPT_LIMIT], source)
    commands = [at for at, (number, line) in enumerate(lines)
                if any(COMMAND.search(word) for word in _words(line, source, number))]
    if len(commands) != 1:
        numbers = ", ".join(str(lines[at][0]) for at in commands)
        raise ConfigError(f"{source} has {len(commands)} commands that run verl.trainer.main_ppo" +
                          (f" (lines {numbers})" if commands else ""),
                          hint="give rlkit migrate a script with one verl.trainer.main_ppo command")
    variables = collect(lines[:commands[0]])
    number, line = lines[commands[0]]
    expanded, made = expand_line(line, variables, number)
    words = _words(expanded, source, number)
    at = next(i for i, word in enumerate(words) if COMMAND.search(word))
    end = next((i for i in range(at + 1, len(words)) if _ends(words, i)), len(words))
    run = VerlRun({}, assigned={name: _shown(text) for name, text in variables.assigned.items()},
                  expanded=list(dict.fromkeys(made)))
    for word in words[at + 1:end]:
        _take(word, run)
    if any(isinstance(value, str) and "${" in value for value in run.leaves.values()):
        run.leaves = _resolved(run.leaves, source)
    return run


def _shown(written: str) -> str:
    """An assignment's text as the header shows it: its quotes removed where the shell's splitting can."""
    try:
        words = shlex.split(written, posix=True)
    except ValueError:
        return written
    return words[0] if len(words) == 1 else written


def _resolved(leaves: dict[str, Any], source: str) -> dict[str, Any]:
    """The values' Hydra references to the run's own keys (`'${trainer.project_name}'`, quoted away from the shell)
    resolved as verl's Hydra resolves them: rlkit's file will not have verl's keys. A key both set and nested under
    (`a.b=1 a.b.c=2`) keeps the later."""
    tree: dict[str, Any] = {}
    for key, value in leaves.items():
        node = tree
        *parents, last = key.split(".")
        for part in parents:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[last] = value
    resolved, _ = resolve_references(tree, source)
    return dict(_leaves(resolved))


def _ends(words: list[str], i: int) -> bool:
    """Whether the command ends at words[i]: `;`, `&&`, `|`, a redirection (`2>&1`'s 2 included)."""
    def operator(word: str) -> bool:
        return bool(word) and set(word) <= set(";&|<>()")
    return operator(words[i]) or (words[i].isdigit() and i + 1 < len(words) and words[i + 1][:1] in "<>")


def _words(line: str, source: str, number: int) -> list[str]:
    """The line's words as the shell splits them, a `$(...)` or `$((...))` kept whole inside its word: its
    parentheses would otherwise end the command there, and every key after it would go unread."""
    line, spans = _substitutions(line)
    lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>()")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    try:
        words = list(lexer)
    except ValueError as exc:  # an unclosed quote
        raise ConfigError(f"{source} line {number} cannot be split into words as the shell splits it: {exc}",
                          hint="close the quote (a value with spaces goes in '...' or \"...\")") from None
    return [_PLACEHOLDER.sub(lambda m: spans[int(m.group(1))], word) for word in words] if spans else words


def _substitutions(line: str) -> tuple[str, list[str]]:
    """`line` with each `$(`...`)` whose parentheses balance replaced by a placeholder, and the spans replaced."""
    spans: list[str] = []
    out, i = [], 0
    while (start := line.find("$(", i)) >= 0:
        depth, j = 0, start + 1
        for j in range(start + 1, len(line)):
            depth += {"(": 1, ")": -1}.get(line[j], 0)
            if depth == 0:
                break
        if depth:  # unbalanced: left as written
            break
        out.append(line[i:start] + f"\x01{len(spans)}\x02")
        spans.append(line[start:j + 1])
        i = j + 1
    return "".join(out) + line[i:], spans


def _take(word: str, run: VerlRun) -> None:
    """One word of the command: a key=value (Hydra's +key= and ++key= forms too) into run.leaves, "$@" and the
    like dropped, anything else named in run.ignored (and in run.unread when it is a variable rlkit left
    unexpanded, which bash would make key=value words)."""
    if _ARGUMENTS.fullmatch(word):
        return
    if _WHOLE.fullmatch(word):
        run.unread.append(word)
    key, equals, text = word.partition("=")
    key = key.lstrip("+")
    if not equals or not _KEY.fullmatch(key):
        run.ignored.append(word)
        return
    names = [a or b for a, b in _VARIABLE.findall(_SUBSTITUTION.sub("", text))]
    names += [found[1:] for found in _SUBSTITUTION.findall(text)]  # $((...)): named as written, not computed
    if names:
        run.variables[key] = names
        run.leaves[key] = _VARIABLE.sub(lambda m: f"${m.group(1) or m.group(2)}", text)
        return
    run.leaves[key] = typed(text)


def unread_error(run: VerlRun, source: str) -> ConfigError | None:
    """The refusal of a run whose command holds variables left unexpanded as whole words (verl's `$ACTOR_CONFIG`,
    `"${ACTOR_CONFIG[@]}"`): bash makes them key=value words, so the keys they hold would be lost unread."""
    if not run.unread:
        return None
    def assigned(word: str) -> bool:
        match = _WHOLE.fullmatch(word)
        return match is not None and (match.group(1) or match.group(3)) in run.assigned

    said = [f"{', '.join(words)} ({why})" for words, why in (
        ([w for w in run.unread if assigned(w)], "set where rlkit does not follow: in an if, a loop or a function, "
                                                 "from a command, or after a source"),
        ([w for w in run.unread if not assigned(w)], "never set by the script: the environment's")) if words]
    return ConfigError(f"the verl command's words {'; '.join(said)} ({source}): bash makes each variable's value "
                       "key=value words, which rlkit cannot know, so those keys would be lost",
                       hint="write the keys into the command (or set the variable at the script's top level from "
                            "literals), then migrate again")


def typed(text: str) -> Any:
    """A Hydra override's value as the type Hydra gives it: numbers, bools, null, [lists] and {maps}; text else."""
    if _EXPONENT.fullmatch(text):
        return float(text)
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return value if value is not None or text.strip() in ("null", "~") else text
