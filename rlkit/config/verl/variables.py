"""The shell variables a verl run script assigns before its verl.trainer.main_ppo command, and that command's line
with them expanded as bash would: verl's example scripts set `kl_coef=0.0`, `NNODES=${NNODES:-16}`,
`max_response_length=$((1024 * 8))` and write `algorithm.kl_ctrl.kl_coef=$kl_coef`.

Read, never run. A variable has a value rlkit takes when the script assigns it at its top level (`name=value`,
`export name=value`, quoted or not) from literals, earlier such variables, `${name:-default}` / `${name-default}` (the
default when the script never sets name: the header says that a name set in verl's environment, or the script's
argument for `${1:-...}`, would win) and `$((...))` over integers; an array `name=( word ... )` of such words (verl's
megatron and NPU examples list their keys one a line in arrays), `"${name[@]}"` giving its words and `$name` its
first. Anything else leaves the variable unexpanded, as written: a command substitution `$(...)` or backquote,
`${#x}`, `${x[1]}` and the other `${...}` forms, `~`, a
variable assigned inside an if, loop, function, subshell or `&&`/`||` list, or `declare`d, `read`, `unset`, or set
before a `source` (the sourced file could set it again). A variable the script never sets (`$HOME`, `$PWD`, ...) stays
as written too: its value is the environment of wherever verl runs, which rlkit cannot see, and the migration's
header names each one left (a path under `$HOME` is then visibly the user's to give, not silently this machine's).
An unquoted expansion's words split as bash splits them; its glob characters are taken as matching no file, bash's
result in a directory holding none (verl's `[...]` lists)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rlkit.config.verl.shell import NAME, arithmetic, raw_words, reference, reference_end, skip_quoted

_IFS = " \t\n"
_BLANKS = re.compile("[ \t\n]+")
_VALUE_LIMIT = 1 << 16  # characters of a variable's value; a longer one (x=$x$x ... doubling) stays unexpanded
_NESTING_LIMIT = 16  # ${a:-${b:-...}} levels followed
_OPENERS = {"if", "while", "until", "for", "select", "case", "{"}
_CLOSERS = {"fi", "done", "esac", "}"}
_KEYWORDS = {"then", "do", "else", "elif", "!"} | _OPENERS
_SETTERS = {"declare", "typeset", "local", "readonly", "unset", "read", "for", "select", "let", "printf", "mapfile",
            "readarray", "getopts"}
_LISTS = {"&&", "||", "|", "&", "(", ")", "|&"}


@dataclass(frozen=True)
class Value:
    """A variable's value, the line that set it, and the `${NAME:-default}`s whose default it took."""

    text: str
    line: int
    defaults: tuple[str, ...] = ()
    items: tuple[str, ...] | None = None  # an array's words (text: its first, as bash's $NAME gives)


@dataclass(frozen=True)
class Expansion:
    """One expansion made in the command: the variable (or the `$((...))` as written) and its value."""

    name: str
    value: Value


@dataclass
class Variables:
    """The script's variables at its verl command: those with a value, those it sets in ways not followed."""

    known: dict[str, Value] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)
    assigned: dict[str, str] = field(default_factory=dict)  # every name=text the script writes, as written
    sourced: bool = False  # a `source`/`.`/`eval` ran before: any variable not set after it is unknowable


def collect(lines: list[tuple[int, str]]) -> Variables:
    """The variables the script's `lines` (those before its verl command) leave, as bash would."""
    variables = Variables()
    depth = 0
    for number, line in lines:
        words, arrays = _arrays(raw_words(line))
        listed = bool(_LISTS & set(words))
        for command in _commands(words):
            first = command[0]
            depth = depth + (first in _OPENERS) - (first in _CLOSERS and depth > 0)
            if first in ("for", "select") and len(command) > 1:
                _assign(variables, command[1], None)
            while command and command[0] in _KEYWORDS | _CLOSERS:
                command = command[1:]
            if command:
                _command(variables, command, number, depth, listed, arrays)
    return variables


def _arrays(words: list[str]) -> tuple[list[str], list[list[str] | None]]:
    """The line's words with each array assignment `NAME=`, `(`, words..., `)` made one word `NAME=\0k`, and the
    arrays' words as written (k: its index; None for `NAME+=(...)`, an append not followed)."""
    out: list[str] = []
    arrays: list[list[str] | None] = []
    i = 0
    while i < len(words):
        word = words[i]
        close = words.index(")", i) if ")" in words[i:] else -1
        name = word[:-2] if word.endswith("+=") else word[:-1]
        if word.endswith("=") and NAME.fullmatch(name) and words[i + 1:i + 2] == ["("] and close > i and \
                not any(set(w) <= set(";&|<>()") for w in words[i + 2:close]):
            out.append(f"{name}=\0{len(arrays)}")
            arrays.append(None if word.endswith("+=") else words[i + 2:close])
            i = close + 1
            continue
        out.append(word)
        i += 1
    return out, arrays


def _array_value(elements: list[str] | None, variables: Variables, line: int) -> Value | None:
    """An array's value: each word's value as bash makes it (None when one would split)."""
    if elements is None:
        return None
    items = [value_of(word, variables, line, fields=True) for word in elements]
    if any(item is None for item in items):
        return None
    texts = tuple(item.text for item in items if item is not None)
    defaults = tuple(dict.fromkeys(d for item in items if item is not None for d in item.defaults))
    return Value(texts[0] if texts else "", line, defaults, texts)


def _command(variables: Variables, command: list[str], number: int, depth: int, listed: bool,
             arrays: list[list[str] | None]) -> None:
    """One simple command's effect on the variables: a top-level assignment's value, or its names made unknown."""
    export = command[0] == "export"
    body = command[export:]
    names = [word.split("=", 1)[0] for word in body if _assigns(word)]
    def array(written: str) -> list[str] | None:
        return arrays[int(written[1:])] if written.startswith("\0") else None

    for word in body:
        if _assigns(word):
            name, written = word.split("=", 1)
            variables.assigned[name] = f"({' '.join(array(written) or ())})" if written.startswith("\0") else written
    if body and len(names) == len(body) and not depth and not listed:
        for word in body:
            name, written = word.split("=", 1)
            _assign(variables, name, _array_value(array(written), variables, number) if written.startswith("\0")
                    else value_of(written, variables, number))
    elif command[0] in ("source", ".", "eval"):
        variables.sourced = True
        variables.unknown |= set(variables.known)
        variables.known.clear()
    elif export or depth or listed or command[0] in _SETTERS:
        setter = command[0] in _SETTERS
        for name in names + [word for word in command[1:] if setter and NAME.fullmatch(word)]:
            _assign(variables, name, None)


def _assigns(word: str) -> bool:
    return "=" in word and bool(NAME.fullmatch(word.split("=", 1)[0]))


def _commands(words: list[str]) -> list[list[str]]:
    """The line's simple commands: its words between operators (`;`, `&&`, `|`, a redirection, a parenthesis)."""
    commands: list[list[str]] = []
    current: list[str] = []
    for word in words:
        if word and set(word) <= set(";&|<>()"):
            if current:
                commands.append(current)
            current = []
        else:
            current.append(word)
    return [*commands, current] if current else commands


def _assign(variables: Variables, name: str, value: Value | None) -> None:
    if value is None or len(value.text) > _VALUE_LIMIT:
        variables.known.pop(name, None)
        variables.unknown.add(name)
    else:
        variables.known[name] = value
        variables.unknown.discard(name)


def value_of(written: str, variables: Variables, line: int, depth: int = 0, fields: bool = False) -> Value | None:
    """A word's value as bash gives it in an assignment (quotes removed, references expanded, no splitting); None when
    any part of it is not known. `fields`: an array's word, which stands for a word of the command: a reference
    without a value kept as written, as the command keeps one; None when an unquoted value would split (or vanish,
    or is an array's words)."""
    out: list[str] = []
    defaults: tuple[str, ...] = ()
    i, quoted = 0, False
    while i < len(written):
        c = written[i]
        if c == '"':
            quoted, i = not quoted, i + 1
        elif c == "'" and not quoted:
            j = skip_quoted(written, i)
            out.append(written[i + 1:j - 1])
            i = j
        elif c == "\\":
            nxt = written[i + 1:i + 2]
            out.append(nxt if not quoted or nxt in '$`"\\' else c + nxt)
            i += 2
        elif c == "$" and reference_end(written, i) > i + 1:
            j = reference_end(written, i)
            found = expand(written[i:j], variables, line, depth)
            if found is not None and fields and not quoted and \
                    (found.value.items is not None or not found.value.text or set(found.value.text) & set(_IFS)):
                return None
            if found is not None:
                out.append(found.value.text)
                defaults += found.value.defaults
            elif fields or _environment(written[i:j], variables):
                out.append(written[i:j])  # $HOME and the like (any, in an array's word): kept, as the command keeps it
            else:
                return None
            i = j
        elif c == "`" or (c == "$" and written[i + 1:i + 2] in ("'", '"')) or (c == "~" and not quoted):
            return None  # a command substitution, $'...', or a ~ bash would make the home directory
        else:
            out.append(c)
            i += 1
    return Value("".join(out), line, tuple(dict.fromkeys(defaults)))


def expand(written: str, variables: Variables, line: int, depth: int = 0) -> Expansion | None:
    """The value of one `$` reference as written, or None where rlkit leaves it unexpanded."""
    ref = reference(written)
    if depth > _NESTING_LIMIT:
        return None
    if ref.kind == "name":
        value = variables.known.get(ref.name)
        return Expansion(ref.name, Value(value.text, value.line, value.defaults)) if value else None
    if ref.kind == "array":
        value = variables.known.get(ref.name)
        if value is None:
            return None
        items = value.items if value.items is not None else (value.text,)
        return Expansion(written, Value(" ".join(items), value.line, value.defaults, items))
    if ref.kind == "default":
        if ref.name in variables.unknown:
            return None
        value = variables.known.get(ref.name)
        if value is not None and not (ref.op == ":-" and value.text == ""):
            return Expansion(ref.name, value)
        if value is None and variables.sourced:
            return None
        default = value_of(ref.word, variables, line, depth + 1)
        if default is None:
            return None
        taken = default.defaults + (ref.name,) * (value is None)
        return Expansion(ref.name, Value(default.text, line, tuple(dict.fromkeys(taken))))
    if ref.kind == "arithmetic":
        used: list[str] = []

        def integer(name: str) -> int | None:
            value = variables.known.get(name)
            if value is None or not (value.text.strip() == "" or _integer(value.text)):
                return None
            used.extend(value.defaults)
            return int(value.text) if value.text.strip() else 0

        result = arithmetic(ref.word, integer)
        return None if result is None else Expansion(written, Value(str(result), line, tuple(dict.fromkeys(used))))
    return None


def _environment(written: str, variables: Variables) -> bool:
    """Whether `written` is a plain `$NAME` / `${NAME}` the script never sets (before any `source`): the
    environment's."""
    ref = reference(written)
    return ref.kind == "name" and ref.name not in variables.unknown and not variables.sourced


def _integer(text: str) -> bool:
    """Whether bash's arithmetic reads `text` as the decimal integer Python's int() does (a leading 0 is octal)."""
    digits = text.strip().lstrip("+-")
    return digits.isdigit() and digits.isascii() and (digits == "0" or not digits.startswith("0")) and len(digits) < 19


def expand_line(line: str, variables: Variables, number: int) -> tuple[str, list[Expansion]]:
    """The command's line with each reference rlkit can expand replaced by its value, quoted so that the line splits
    into the words bash would make (an unquoted value split at its blanks, a double-quoted one kept whole); every
    other reference left as written."""
    out: list[str] = []
    made: list[Expansion] = []
    splits = "IFS" not in variables.assigned  # a script setting IFS splits otherwise: its unquoted values kept
    i, quoted = 0, False
    while i < len(line):
        c = line[i]
        if c == '"':
            quoted, j = not quoted, i + 1
        elif c in "\\`" or (c == "'" and not quoted):
            j = skip_quoted(line, i)
        elif c == "$" and reference_end(line, i) > i + 1:
            j = reference_end(line, i)
            found = expand(line[i:j], variables, number)
            if found is not None and (quoted or splits):
                made.append(found)
                items = found.value.items
                if quoted and items == () and out[-1:] == ['"'] and line[j:j + 1] == '"' and \
                        line[i - 2:i - 1] in ("", *_IFS) and line[j + 1:j + 2] in ("", *_IFS):
                    out.pop()  # a whole word "${a[@]}" of no words: no word at all, as in bash
                    i, quoted = j + 1, False
                    continue
                if quoted and items is not None and reference(line[i:j]).op == "@":  # "${a[@]}": a word each
                    out.append('" "'.join(_double_quoted(item) for item in items))
                else:
                    out.append(_double_quoted(found.value.text) if quoted else _fields(found.value.text))
                i = j
                continue
        else:
            j = i + 1
        out.append(line[i:j])
        i = j
    return "".join(out), made


def _double_quoted(text: str) -> str:
    """`text` inside "...", escaped for the word splitting of rlkit.config.verl.source (shlex's)."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _fields(text: str) -> str:
    """An unquoted expansion's value: its words (split at blanks, as bash's default IFS splits) each quoted whole."""
    words = [word for word in _BLANKS.split(text) if word]
    if not words:
        return " " if text else ""
    quoted = " ".join("'" + word.replace("'", "'\\''") + "'" for word in words)
    return (" " if text[0] in _IFS else "") + quoted + (" " if text[-1] in _IFS else "")
