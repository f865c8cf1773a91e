"""Every ``snapstream ...`` command line that README.md and docs/*.md show is one the command
line accepts today: each is parsed by the parser of ``cli/main.py``'s registry (``parse_args``
only: nothing runs, so commands that need a cluster, a model or hours are checked alike).

A command is the word ``snapstream`` (or a path ending in it: ``.venv/bin/snapstream``) followed
by a registered command, found in fenced code blocks (continued lines joined; it ends at a shell
operator or a comment) and in inline code spans (which may wrap over lines). A span that only
names a command (``snapstream bench``, ``snapstream models pull``) must name one the parser
has. A word the shell expands (``$2``, ``${1%%-*}``) is checked by the name of its option
alone. A command holding ``...`` or ``…`` is a placeholder, which a test of its own refuses:
write commands in full.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from cli.main import COMMANDS, CliError, build_parser

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
# `snapstream` in command position (at the start, after whitespace or a shell operator)
# followed by a registered command; a path before it (.venv/bin/) is part of the word
START = re.compile(r"(?:^|(?<=[\s;&|(]))(?:[\w./-]*/)?snapstream\s+(?=(?:"
                   + "|".join(map(re.escape, COMMANDS)) + r")(?:\s|$))")
FENCE = re.compile(r"^\s*(```|~~~)")
SHELL_OPERATORS = set("();<>|&")
PLACEHOLDERS = ("...", "…")


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    words: tuple[str, ...]  # after `snapstream`
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _code_words(text: str) -> list[str]:
    """A shell command line's words up to its first operator (``|``, ``&&``, ``>``, ...)."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for word in lexer:
        if word and set(word) <= SHELL_OPERATORS:
            if words and words[-1].isdigit() and word.startswith(">"):
                words.pop()  # 2>&1, 2> file: the descriptor is not an argument
            break
        words.append(word)
    return words


def _span_words(text: str) -> list[str]:
    """An inline span's words: no shell operators there (a table escapes `|` as `\\|`)."""
    return shlex.split(text.replace("\\|", "|"), comments=False)


def _commands_in(path: Path) -> list[DocCommand]:
    lines = path.read_text().splitlines()
    found: list[DocCommand] = []
    in_code, fence = False, ""
    code: list[tuple[int, str]] = []  # (line number, text) of the open code block
    prose: list[tuple[int, str]] = []  # the open paragraph
    for number, line in enumerate(lines, 1):
        opening = FENCE.match(line)
        if opening and (not in_code or opening.group(1) == fence):
            if in_code:
                found += _in_code(path, code)
                code = []
            else:
                found += _in_prose(path, prose)
                prose = []
                fence = opening.group(1)
            in_code = not in_code
        elif in_code:
            code.append((number, line))
        elif line.strip():
            prose.append((number, line))
        else:
            found += _in_prose(path, prose)
            prose = []
    found += _in_code(path, code) + _in_prose(path, prose)
    return found


def _in_code(path: Path, code: list[tuple[int, str]]) -> list[DocCommand]:
    found, joined, first = [], "", None
    for number, line in code:
        first = number if first is None else first
        if line.rstrip().endswith("\\"):
            joined += line.rstrip()[:-1] + " "
            continue
        joined += line
        for match in START.finditer(joined):
            text = joined[match.start():]
            found.append(DocCommand(path, first, tuple(_code_words(text)[1:]), text))
        joined, first = "", None
    return found


def _in_prose(path: Path, paragraph: list[tuple[int, str]]) -> list[DocCommand]:
    found = []
    text = "\n".join(line for _, line in paragraph)
    for span in re.finditer(r"(`+)(.+?)\1", text, flags=re.DOTALL):
        content = span.group(2).replace("\n", " ").strip()
        match = START.match(content)
        if match is None:
            continue
        line = paragraph[text.count("\n", 0, span.start())][0]
        found.append(DocCommand(path, line, tuple(_span_words(content)[1:]), content))
    return found


COMMANDS_IN_DOCS = [command for path in DOCS for command in _commands_in(path)]


def _names_a_command(words: tuple[str, ...]) -> bool:
    """``words`` only name a command or a group of them (``bench``, ``bench kv``, ``models
    pull``): each is a subcommand of the one before."""
    if not words or any(word.startswith("-") for word in words):
        return False
    parser = build_parser(list(words))
    for word in words:
        choices = _subcommands(parser)
        if word not in choices:
            return False
        parser = choices[word]
    return True


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    return next((action.choices for action in parser._actions
                 if isinstance(action, argparse._SubParsersAction)), {})


def _leaf_parser(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The parser of the (sub)command ``words`` choose."""
    for word in words:
        choices = _subcommands(parser)
        if word not in choices:
            break
        parser = choices[word]
    return parser


def _without_expansions(words: tuple[str, ...]) -> tuple[list[str], list[str]]:
    """``words`` less the shell's expansions and the options they are the values of; -> (the
    words to parse, the options whose values the shell gives)."""
    kept: list[str] = []
    options: list[str] = []
    for word in words:
        if "$" not in word:
            kept.append(word)
        elif kept and kept[-1].startswith("--") and "=" not in kept[-1]:
            options.append(kept.pop())
        else:
            raise AssertionError(f"{word!r}: a shell expansion that is not an option's value")
    return kept, options


def test_the_docs_show_commands_of_every_kind():
    """The extraction finds commands in code blocks and spans of several pages (a change in
    the docs' markup that hid them would otherwise pass every check below)."""
    pages = {command.path.name for command in COMMANDS_IN_DOCS}
    assert len(COMMANDS_IN_DOCS) >= 50, len(COMMANDS_IN_DOCS)
    assert {"README.md", "benchmarks.md", "deploy.md", "hwsim.md"} <= pages, pages
    assert {command.words[0] for command in COMMANDS_IN_DOCS} >= {"up", "bench", "eval", "sim"}


def test_the_docs_show_no_placeholder_commands():
    placeholders = [f"{c.where}: {c.text}" for c in COMMANDS_IN_DOCS
                    if any(mark in c.text for mark in PLACEHOLDERS)]
    assert not placeholders, "write these commands in full:\n" + "\n".join(placeholders)


@pytest.mark.parametrize("command", COMMANDS_IN_DOCS, ids=lambda command: command.where)
def test_a_documented_command_parses(command: DocCommand):
    if any(mark in command.text for mark in PLACEHOLDERS):
        pytest.skip("a placeholder (see test_the_docs_show_no_placeholder_commands)")
    if _names_a_command(command.words):
        return
    words, expanded = _without_expansions(command.words)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            parser = build_parser(words)
            parser.parse_args(words)
    except CliError as exc:
        pytest.fail(f"{command.where}: snapstream {' '.join(command.words)}\n  -> {exc}")
    except SystemExit as exc:  # --help prints and exits 0
        assert exc.code == 0, (f"{command.where}: snapstream {' '.join(command.words)}\n"
                               f"  -> {out.getvalue().strip()}")
    known = _leaf_parser(parser, words)._option_string_actions
    unknown = [option for option in expanded if option not in known]
    assert not unknown, f"{command.where}: unknown options {unknown}"
