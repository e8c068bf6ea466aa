"""How bash reads a run script's text, done without running any of it: its logical lines, the words and operators of a
line, where a `$` reference ends and what form it is, and `$((...))` arithmetic over integers (a tiny parser, no eval).
rlkit.config.verl.variables gives the references their values. Nothing here runs a command: a `$(...)` or a backquote
is only skipped over."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from rlkit.errors import ConfigError

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEFAULT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|[0-9])(:?-)(.*)", re.DOTALL)
OPERATORS = set(";&|<>()")
_INT64 = 1 << 63
_ARITHMETIC_LIMIT = 200  # characters of a $((...)) evaluated; a longer one stays as written
_ARRAY_START = re.compile(r"(?:^|[ \t\n;&|])[A-Za-z_][A-Za-z0-9_]*\+?=$")  # `NAME=` (or +=) just before a `(`
_ARRAY_WINDOW = 130  # characters before a `(` looked at for its `NAME=`


def logical_lines(text: str, source: str) -> list[tuple[int, str]]:
    """The script's lines as bash reads them, each with the number of its first line: `\\` + newline joined (outside
    single quotes), a newline inside quotes or inside an array assignment's `NAME=( ... )` kept in its line (verl's
    scripts list their keys one a line in arrays), comments and here-documents' bodies dropped, so that a quote in a
    comment opens nothing. ConfigError naming the line of a quote never closed."""
    text = text.replace("\r\n", "\n")
    lines: list[tuple[int, str]] = []
    buf: list[str] = []
    quote, start, number, i = "", 1, 1, 0
    array = False  # inside an array assignment's parentheses: a newline separates its words
    physical = text.split("\n")
    while i < len(text):
        c = text[i]
        if quote == "'" or (quote == '"' and c != "\\"):
            quote = "" if c == quote else quote
            number += c == "\n"
            buf.append(c)
        elif c == "\\":
            if text[i + 1:i + 2] == "\n":
                number += 1
            else:
                buf.append(text[i:i + 2])
            i += 2
            continue
        elif c in "'\"":
            quote = c
            buf.append(c)
        elif c == "#" and (not buf or buf[-1][-1] in " \t\n;&|()"):
            end = text.find("\n", i)
            i = len(text) if end < 0 else end
            continue
        elif c == "\n" and array:
            number += 1
            buf.append(c)
        elif c == "\n":
            line = "".join(buf)
            lines.append((start, line))
            number, i = number + 1, i + 1
            delimiter = _heredoc(line)
            while delimiter and number <= len(physical):  # its body is data, not commands: skipped
                body = physical[number - 1]
                number, i = number + 1, i + len(body) + 1
                if body.strip() == delimiter:
                    break
            buf, start = [], number
            continue
        else:
            if c == "(" and not array:
                array = bool(_ARRAY_START.search("".join(buf[-_ARRAY_WINDOW:])))
            elif c == ")":
                array = False
            buf.append(c)
        i += 1
    if quote:
        raise ConfigError(f"{source} line {start} cannot be split into words as the shell splits it: No closing "
                          "quotation", hint="close the quote (a value with spaces goes in '...' or \"...\")")
    if buf:
        lines.append((start, "".join(buf)))
    return lines


def _heredoc(line: str) -> str:
    """The word that ends the line's here-document (`<<EOF`, `<<-'EOF'`), or ""."""
    words = raw_words(line)
    at = next((k for k, word in enumerate(words) if word in ("<<", "<<-")), None)
    if at is None or at + 1 >= len(words):
        return ""
    return words[at + 1].lstrip("-").strip("'\"")


def skip_quoted(text: str, i: int) -> int:
    """The index after the quoted span, `\\`-escape or backquoted command starting at text[i]; len(text) when it
    never closes."""
    c = text[i]
    if c == "\\":
        return min(i + 2, len(text))
    if c == "'":
        end = text.find("'", i + 1)
        return len(text) if end < 0 else end + 1
    j = i + 1
    while j < len(text) and text[j] != c:
        if text[j] == "\\":
            j += 1
        elif c == '"' and text[j] == "$":
            j = reference_end(text, j) - 1
        j += 1
    return min(j + 1, len(text))


def reference_end(text: str, i: int) -> int:
    """The index after the `$` reference at text[i] (`$name`, `${...}`, `$(...)`, `$((...))`, `$1`, `$@`, ...);
    i + 1 for a `$` that starts none. Nested quotes and references are skipped; one never closed runs to the end."""
    nxt = text[i + 1:i + 2]
    if nxt in ("(", "{"):
        close, depth, j = {"(": ")", "{": "}"}[nxt], 0, i + 1
        while j < len(text):
            c = text[j]
            if c in "'\"`\\":
                j = skip_quoted(text, j)
                continue
            if c == "$":
                j = reference_end(text, j)
                continue
            depth += (c == nxt) - (c == close)
            j += 1
            if depth == 0:
                return j
        return len(text)
    if match := NAME.match(text, i + 1):
        return match.end()
    return i + 2 if nxt and (nxt.isdigit() or nxt in "@*#?$!-") else i + 1


@dataclass(frozen=True)
class Reference:
    """One `$` reference as written: `kind` name ($x, ${x}), default (${x:-word} / ${x-word}: `op`, `word`), array
    (${x[@]} / ${x[*]}: `op` @ or *), arithmetic ($((...)): `word` the expression), or other (anything rlkit does not
    expand: $(...), ${#x}, ${x[1]}, $1, ...)."""

    kind: str
    name: str = ""
    op: str = ""
    word: str = ""


def reference(written: str) -> Reference:
    """What the reference `written` (as reference_end delimits it) is."""
    if written.startswith("$((") and written.endswith("))"):
        return Reference("arithmetic", word=written[3:-2])
    if written.startswith("${") and written.endswith("}"):
        inner = written[2:-1]
        if NAME.fullmatch(inner):
            return Reference("name", inner)
        if inner[-3:] in ("[@]", "[*]") and NAME.fullmatch(inner[:-3]):
            return Reference("array", inner[:-3], inner[-2])
        if match := _DEFAULT.fullmatch(inner):
            return Reference("default", match.group(1), match.group(2), match.group(3))
        return Reference("other")
    if NAME.fullmatch(written[1:]):
        return Reference("name", written[1:])
    return Reference("other")


def raw_words(line: str) -> list[str]:
    """The line's words as written (quotes kept) and its operators (`;`, `&&`, `|`, `(`, ...) as words of their own."""
    words: list[str] = []
    i, word = 0, ""
    while i < len(line):
        c = line[i]
        if c in " \t\n" or c in OPERATORS:
            if word:
                words.append(word)
                word = ""
            if c in OPERATORS:
                j = i + 1
                while j < len(line) and line[j] in OPERATORS and line[j] not in "()" and c not in "()":
                    j += 1
                words.append(line[i:j])
                i = j
                continue
            i += 1
        elif c in "'\"`\\":
            j = skip_quoted(line, i)
            word, i = word + line[i:j], j
        elif c == "$":
            j = reference_end(line, i)
            word, i = word + line[i:j], j
        else:
            word, i = word + c, i + 1
    return [*words, word] if word else words


def arithmetic(expression: str, value_of: Callable[[str], int | None]) -> int | None:
    """bash's `$((expression))` over integer literals, variables (`x`, `$x`, `${x}`: value_of gives each, None when it
    has no integer value), + - * / % and parentheses, / and % truncating toward zero as bash's do; None for anything
    else (another operator, a command substitution, a division by zero, a result past bash's 64-bit integers)."""
    if len(expression) > _ARITHMETIC_LIMIT:
        return None
    tokens = re.findall(r"\s+|\d+|\$\{[A-Za-z_][A-Za-z0-9_]*\}|\$?[A-Za-z_][A-Za-z0-9_]*|[-+*/%()]|.", expression)
    tokens = [t for t in tokens if not t.isspace()]
    position = 0

    def fits(n: int | None) -> int | None:
        return n if n is not None and -_INT64 <= n < _INT64 else None

    def atom() -> int | None:
        nonlocal position
        if position >= len(tokens):
            return None
        token = tokens[position]
        position += 1
        if token in ("+", "-"):
            inner = atom()
            return None if inner is None else (inner if token == "+" else -inner)
        if token == "(":
            inner = sum_()
            if position >= len(tokens) or tokens[position] != ")":
                return None
            position += 1
            return inner
        if token.isdigit():  # a leading 0 is octal to bash: not taken
            return int(token) if (token == "0" or not token.startswith("0")) and len(token) <= 19 else None
        name = token.strip("${}")
        return value_of(name) if NAME.fullmatch(name) else None

    def product() -> int | None:
        nonlocal position
        left = atom()
        while left is not None and position < len(tokens) and tokens[position] in ("*", "/", "%"):
            op = tokens[position]
            position += 1
            right = atom()
            if right is None or (op != "*" and right == 0):
                return None
            if op == "*":
                left = fits(left * right)
            else:
                quotient = abs(left) // abs(right) * (1 if (left >= 0) == (right >= 0) else -1)
                left = quotient if op == "/" else left - right * quotient
        return left

    def sum_() -> int | None:
        nonlocal position
        left = product()
        while left is not None and position < len(tokens) and tokens[position] in ("+", "-"):
            op = tokens[position]
            position += 1
            right = product()
            left = None if right is None else fits(left + right if op == "+" else left - right)
        return left

    try:
        result = sum_() if tokens else None
    except RecursionError:
        return None
    return fits(result) if position == len(tokens) else None
