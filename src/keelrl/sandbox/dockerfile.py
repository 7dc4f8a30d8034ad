"""What keelrl reads of a Dockerfile without building it: its instructions as Docker's parser splits them, and the
final image's ARG, ENV and WORKDIR as Docker applies them. The bwrap backend stands a task's environment/Dockerfile
in with these (tasks/harbor.py's `stage_environment`: the final image's COPY / ADD of local files and its ENV), and
a task's working directory is the final image's WORKDIR.

Followed (the Dockerfile reference): the `# escape=` parser directive; lines continued by the escape character
joined as they are, comment and empty lines inside a continuation dropped; RUN / COPY / ADD heredocs (`<<EOF`,
`<<-EOF`, quoted names) kept in their instruction; a multi-stage file's final image is its last stage after the
stages it is built FROM by name; `$VAR`, `${VAR}`, `${VAR:-word}`, `${VAR:+word}` replaced from ARG and ENV (ENV
wins; '...' literal; every pair of one ENV line sees the values from before it); a bare `ARG NAME` takes the
default of a global `ARG NAME=...`. Not followed: `FROM ${ARG}` stage names, the backtick escape inside words,
variables in a heredoc's body, .dockerignore.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping

DIRECTIVE = re.compile(r"#\s*([a-zA-Z]\w*)\s*=\s*(\S+)\s*")  # `# escape=``, `# syntax=...` at the top
HEREDOC = re.compile(r"<<(-?)([\"']?)([A-Za-z_][\w.-]*)\2")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?:(:?[-+])([^}]*))?\}|(\w+))")


def heredocs(head: str) -> list[re.Match[str]]:
    """The heredocs an instruction's line opens: its words (outside quotes) that are `<<NAME` or `<<-NAME`, as
    Docker finds them (`1<<x` or `"a <<b"` open none)."""
    try:
        words = shlex.split(head)
    except ValueError:  # unbalanced quotes: no word is sure
        return []
    return [m for w in words if (m := HEREDOC.fullmatch(w))]


def heredoc_body(lines: list[str], i: int, dash: str, name: str) -> tuple[list[str], int]:
    """The body of a heredoc that starts at lines[i] (leading tabs dropped for `<<-`), and the line after its end."""
    body: list[str] = []
    while i < len(lines):
        line = lines[i].lstrip("\t") if dash else lines[i]
        i += 1
        if line == name:
            break
        body.append(line)
    return body, i


def dockerfile_steps(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, read as Docker reads a Dockerfile: its escape directive, lines
    continued by the escape character joined as they are (comment and empty lines inside them dropped), comments
    dropped; a RUN / COPY / ADD heredoc's lines stay in its arguments (after a newline), not read as instructions."""
    lines, escape, i = text.splitlines(), "\\", 0
    # parser directives, at the very top
    while i < len(lines) and (m := DIRECTIVE.fullmatch(lines[i].strip())):
        escape = m[2] if m[1].lower() == "escape" and m[2] in ("\\", "`") else escape
        i += 1
    continued = re.compile(re.escape(escape) + r"[ \t]*$")
    steps: list[tuple[str, str]] = []
    while i < len(lines):
        line, i = lines[i].strip(), i + 1
        if line[:1] in ("", "#"):
            continue
        while m := continued.search(line):
            line = line[: m.start()]
            while i < len(lines) and lines[i].strip()[:1] in ("", "#"):
                i += 1
            if i == len(lines):
                break
            line, i = line + lines[i], i + 1
        op, *rest = line.split(None, 1)
        op, arg = op.upper(), "".join(rest).strip()
        if op in ("RUN", "COPY", "ADD"):
            for doc in heredocs(arg):
                _, end = heredoc_body(lines, i, doc[1], doc[3])
                arg, i = "\n".join([arg, *lines[i:end]]), end
        steps.append((op, arg))
    return steps


def split_words(text: str, variables: Mapping[str, str], split: bool = True) -> list[str]:
    """Docker's reading of an instruction's words: quotes removed ('...' taken as it is, "..." with its variables),
    a backslash escaping the next character, $VAR / ${VAR} / ${VAR:-word} / ${VAR:+word} (and `-`, `+`) replaced
    from `variables` (unset: empty), unquoted whitespace between words (kept when not `split`)."""
    words: list[str] = []
    word: list[str] = []
    quote, quoted, i = "", False, 0
    while i < len(text):
        c = text[i]
        if quote == "'":
            quote = "" if c == "'" else quote
            word += [] if c == "'" else [c]
        elif c == "\\" and i + 1 < len(text) and (not quote or text[i + 1] in '"$\\'):
            word.append(text[i + 1])
            i += 1
        elif c == "$" and (m := VARIABLE.match(text, i)):
            name, how, alt = m[1] or m[4], m[2], m[3] or ""
            value = variables.get(name)
            if how in (":-", "-") and (not value if how == ":-" else value is None):
                value = "".join(split_words(alt, variables, split=False))
            elif how in (":+", "+"):
                value = "".join(split_words(alt, variables, split=False)) if (value if how == ":+" else value is not None) else ""  # fmt: skip
            word.append(value or "")
            i = m.end()
            continue
        elif not quote and c in "'\"":
            quote, quoted = c, True
        elif quote == '"' and c == '"':
            quote = ""
        elif not quote and split and c.isspace():
            if word or quoted:
                words.append("".join(word))
            word, quoted = [], False
        else:
            word.append(c)
        i += 1
    if quote:
        raise ValueError(f"an unterminated {quote} quote in {text!r}")
    return [*words, "".join(word)] if word or quoted else words


def final_stage(steps: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The steps (FROM lines left out) that build the image a Dockerfile ends with: its last stage's, after those
    of the earlier stages that stage is built FROM by name (`FROM base AS app`), whose files and settings it
    inherits. Other stages (a builder that only `COPY --from` reads) do not reach the image."""
    named: dict[str, list[tuple[str, str]]] = {}
    stage: list[tuple[str, str]] = []
    for op, arg in steps:
        if op != "FROM":
            stage.append((op, arg))
            continue
        words = [w for w in arg.split() if not w.startswith("--")]  # --platform=...
        stage = list(named.get(words[0].lower(), [])) if words else []
        if len(words) >= 3 and words[1].lower() == "as":
            named[words[2].lower()] = stage  # the same list: it grows with the stage's own steps
    return stage


def final_steps(
    steps: list[tuple[str, str]], base: Mapping[str, str], env: dict[str, str]
) -> Iterator[tuple[str, str, dict[str, str], str | None]]:
    """The final stage's steps (`final_stage`) with ARG, ENV (into `env`) and WORKDIR applied as Docker applies
    them: each as (INSTRUCTION, arguments, the variables it sees: `base` < ARG < ENV, the WORKDIR after it or
    None). A bare `ARG NAME` takes the default of an `ARG NAME=...` before the first FROM."""
    defaults: dict[str, str] = {}
    for op, arg in steps:
        if op == "FROM":
            break
        if op == "ARG":
            defaults.update(w.partition("=")[::2] for w in split_words(arg, defaults) if "=" in w)
    args: dict[str, str] = {}
    wd: str | None = None
    for op, arg in final_stage(steps):
        seen = {**base, **args, **env}
        if op == "ARG":
            for name, eq, value in (w.partition("=") for w in split_words(arg, seen)):
                if eq or name in defaults:
                    args[name] = value if eq else defaults[name]
        elif op == "ENV":
            first, *rest = arg.split(None, 1)
            if "=" in first:
                env.update(w.partition("=")[::2] for w in split_words(arg, seen))
            else:  # the older `ENV NAME value`: the rest of the line is the value
                env[first] = "".join(split_words("".join(rest), seen, split=False))
        elif op == "WORKDIR":
            wd = posixpath.normpath(posixpath.join(wd or "/", "".join(split_words(arg, seen, split=False))))
        yield op, arg, seen, wd
