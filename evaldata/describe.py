"""A code-search question's description of a function: the first sentence of its docstring,
reworded by a fixed procedure, checked mechanically.

1. The docstring's first sentence (its first paragraph up to the first ``.``, ``!`` or ``?``
   followed by a space), quotes and backticks around single words taken off (```text``` ->
   ``text``), must be prose of ``MIN_WORDS`` to ``MAX_WORDS`` words: letters, digits, spaces,
   ``, ; : ( ) /``, hyphens and apostrophes inside words only (no dotted names, underscores,
   calls, operators or code), and no word with a capital inside it (``SSLContext``).
2. Each word found in ``THESAURUS`` (docstring vocabulary: verbs like *return*, *create*,
   *parse*; nouns like *string*, *file*, *object*) is replaced by its entry.
3. The result is kept when no word of it is related to a word of the function's name
   (:func:`evaldata.words.name_words_in`: a name word with no entry, or whose entry is related
   too, rejects the function), and at least one word and ``MIN_CHANGED_SHARE`` of its content
   words were replaced.

Limits: the wording is mechanical (a synonym may not fit its sense: *set* the verb and *set*
the noun read alike), the unreplaced words still match the docstring in the haystack word for
word, so the task measures retrieval of a reworded summary rather than understanding of code,
and a docstring's first sentence may fit other functions as well as its own (functions whose
first sentences are equal are left out; near-equal ones are not).
"""

from __future__ import annotations

import re

from evaldata.words import content_words, name_words_in

MIN_WORDS = 5
MAX_WORDS = 30
MIN_CHANGED_SHARE = 0.25

THESAURUS: dict[str, str] = {
    "return": "give back", "returns": "gives back", "returned": "given back",
    "returning": "giving back",
    "get": "obtain", "gets": "obtains", "create": "build", "creates": "builds",
    "created": "built", "make": "produce", "makes": "produces", "build": "construct",
    "builds": "constructs", "convert": "transform", "converts": "transforms",
    "converted": "transformed", "check": "verify", "checks": "verifies",
    "find": "locate", "finds": "locates", "search": "look through", "read": "load",
    "reads": "loads", "write": "emit", "writes": "emits", "remove": "delete",
    "removes": "deletes", "delete": "erase", "deletes": "erases", "add": "insert",
    "adds": "inserts", "start": "begin", "starts": "begins", "stop": "halt", "stops": "halts",
    "close": "shut", "closes": "shuts", "parse": "break down", "parses": "breaks down",
    "call": "invoke", "calls": "invokes", "called": "invoked", "run": "execute",
    "runs": "executes", "send": "transmit", "sends": "transmits", "compute": "calculate",
    "computes": "calculates", "calculate": "work out", "calculates": "works out",
    "determine": "figure out", "determines": "figures out", "generate": "produce",
    "generates": "produces", "print": "display", "prints": "displays",
    "update": "refresh", "updates": "refreshes", "handle": "deal with",
    "handles": "deals with", "split": "divide", "splits": "divides", "join": "combine",
    "joins": "combines", "copy": "duplicate", "copies": "duplicates",
    "encode": "serialize", "encodes": "serializes", "decode": "deserialize",
    "decodes": "deserializes", "initialize": "set up", "initializes": "sets up",
    "test": "probe", "tests": "probes", "raise": "signal", "raises": "signals",
    "given": "supplied", "specified": "requested", "specific": "particular", "new": "fresh",
    "current": "present", "default": "fallback", "first": "initial", "last": "final",
    "valid": "well-formed", "invalid": "malformed", "empty": "blank",
    "object": "instance", "objects": "instances", "instance": "object",
    "instances": "objects", "string": "piece of text", "strings": "pieces of text",
    "list": "sequence", "lists": "sequences", "file": "document", "files": "documents",
    "name": "label", "names": "labels", "number": "count", "numbers": "counts",
    "path": "location", "paths": "locations", "directory": "folder",
    "directories": "folders", "error": "failure", "errors": "failures",
    "exception": "error condition", "exceptions": "error conditions",
    "data": "information", "character": "symbol", "characters": "symbols", "line": "row",
    "lines": "rows", "function": "routine", "functions": "routines", "method": "routine",
    "class": "type", "classes": "types", "argument": "parameter",
    "arguments": "parameters", "parameter": "argument", "parameters": "arguments",
    "item": "element", "items": "elements", "element": "item", "elements": "items",
    "dictionary": "mapping", "dict": "mapping", "mapping": "dictionary",
    "graph": "network", "graphs": "networks", "node": "vertex", "nodes": "vertices",
    "edge": "link", "edges": "links", "message": "note", "messages": "notes",
    "header": "heading", "headers": "headings", "module": "source unit",
    "modules": "source units", "value": "setting", "values": "settings",
    "true": "truthy", "false": "falsy", "whether": "if", "specifies": "requests",
    "open": "access", "opens": "accesses", "opened": "accessed", "tree": "hierarchy",
    "count": "tally", "text": "wording", "group": "cluster", "groups": "clusters",
    "hide": "conceal", "hides": "conceals", "show": "reveal", "shows": "reveals",
    "sorted": "ordered", "version": "release", "normalized": "canonical",
    "package": "bundle", "format": "layout", "formats": "layouts", "source": "origin",
    "cache": "memo store", "random": "arbitrary", "process": "task", "processes": "tasks",
    "stack": "pile", "encoding": "charset", "generator": "producer", "frame": "activation",
    "warning": "alert", "warnings": "alerts", "filename": "document label",
    "translate": "render", "length": "size", "prefix": "leading part", "color": "hue",
    "indent": "leading whitespace", "code": "program text", "environment": "surroundings",
    "context": "circumstances", "user": "person", "users": "people", "thread": "worker",
    "threads": "workers", "event": "occurrence", "events": "occurrences",
    "policy": "rule set", "loop": "cycle", "heap": "priority queue", "root": "base",
    "degree": "valency", "set": "collection", "sets": "collections",
    "sequence": "series", "sequences": "series", "config": "settings",
    "configuration": "settings", "buffer": "staging area", "output": "result",
    "input": "incoming text", "page": "leaf", "program": "application",
    "terminal": "console", "stored": "kept",
}

_WORD_OR_GAP = re.compile(r"([A-Za-z][A-Za-z'-]*)")
_PROSE = re.compile(r"[A-Za-z0-9 ,;:()/'-]+")
_NOT_PROSE = re.compile(r"\(\)|(?:^|[^A-Za-z])'|'(?:[^A-Za-z]|$)|[a-z][A-Z]")
_QUOTED_WORD = re.compile(r"``(\w+)``|`(\w+)`|'(\w+)'|\"(\w+)\"")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def first_sentence(docstring: str) -> str:
    """The first sentence of a docstring's first paragraph, on one line."""
    paragraph = " ".join(docstring.strip().split("\n\n")[0].split())
    return _SENTENCE_END.split(paragraph, maxsplit=1)[0]


def describe(docstring: str, name: str) -> str | None:
    """The description of a function called ``name`` with ``docstring``, or None when its first
    sentence is not plain prose or the reworded sentence fails a check (module docstring)."""
    sentence = _QUOTED_WORD.sub(lambda m: next(filter(None, m.groups())),
                                first_sentence(docstring).rstrip("."))
    if (not _PROSE.fullmatch(sentence) or _NOT_PROSE.search(sentence)
            or not MIN_WORDS <= len(sentence.split()) <= MAX_WORDS):
        return None
    pieces = _WORD_OR_GAP.split(sentence)  # gap, word, gap, word, ..., gap
    changed = 0
    for i in range(1, len(pieces), 2):
        if (replacement := THESAURUS.get(pieces[i].lower())) is not None:
            changed += 1
            pieces[i] = replacement[0].upper() + replacement[1:] if i == 1 else replacement
    described = "".join(pieces)
    if name_words_in(described, name) or changed < max(
            1, MIN_CHANGED_SHARE * len(content_words(sentence))):
        return None
    return described + "."
