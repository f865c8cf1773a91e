"""Reading deploy/docker-compose.yml as Compose does, and the settings each service understands.

Compose interpolates ``${VAR}``, ``${VAR:-default}`` (nested), ``${VAR-default}``, ``${VAR:?err}``
and ``$$`` from the shell's environment; the tests interpolate from an explicit mapping so that
the defaults written in the file are what they check.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import yaml

from cli.main import COMMANDS, build_parser
from serving.settings import env_name

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
COMPOSE_FILE = DEPLOY / "docker-compose.yml"
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
OPERATORS = (":-", "-", ":?", "?", ":+", "+")


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` (a parsed YAML tree) with every string interpolated from ``env``."""
    if isinstance(value, str):
        return _interpolate_text(value, env)
    if isinstance(value, dict):
        return {key: interpolate(item, env) for key, item in value.items()}
    if isinstance(value, list):
        return [interpolate(item, env) for item in value]
    return value


def _interpolate_text(text: str, env: Mapping[str, str]) -> str:
    out, i = [], 0
    while i < len(text):
        if text[i] != "$":
            out.append(text[i])
            i += 1
        elif text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("${", i):
            end = _closing_brace(text, i + 1)
            out.append(_expand(text[i + 2:end], env))
            i = end + 1
        elif match := NAME.match(text, i + 1):
            out.append(_lookup(match.group(), env))
            i = match.end()
        else:
            raise ValueError(f"invalid interpolation at {i} in {text!r}")
    return "".join(out)


def _closing_brace(text: str, start: int) -> int:
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    raise ValueError(f"unclosed ${{ in {text!r}")


def _expand(expression: str, env: Mapping[str, str]) -> str:
    match = NAME.match(expression)
    if match is None:
        raise ValueError(f"invalid variable in ${{{expression}}}")
    name, rest = match.group(), expression[match.end():]
    if not rest:
        return _lookup(name, env)
    operator = next((op for op in OPERATORS if rest.startswith(op)), None)
    if operator is None:
        raise ValueError(f"invalid operator in ${{{expression}}}")
    argument = rest[len(operator):]
    value = env.get(name)
    is_set = value is not None and (value != "" or ":" not in operator)
    if operator.endswith("-"):
        return value if is_set else _interpolate_text(argument, env)
    if operator.endswith("?"):
        if not is_set:
            raise ValueError(f"{name} is required: {argument}")
        return value
    return _interpolate_text(argument, env) if is_set else ""


def _lookup(name: str, env: Mapping[str, str]) -> str:
    if name not in env:  # Compose warns and uses ""; a file that relies on that is a bug
        raise ValueError(f"${name} is used without a default")
    return env[name]


def load_compose(env: Mapping[str, str] | None = None, path: Path = COMPOSE_FILE) -> dict:
    """The compose file, YAML merge keys applied, interpolated from ``env`` (default: empty)."""
    return interpolate(yaml.safe_load(path.read_text()), env or {})


def environment(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's ``environment`` (mapping or list form) as str -> str."""
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {key: "" if value is None else str(value) for key, value in raw.items()}


def serve_settings(service: str) -> dict[str, str]:
    """Environment twin -> flag of every setting of ``snapstream serve <service>``."""
    parser = argparse.ArgumentParser()
    with only_environment({}):
        importlib.import_module(COMMANDS["serve"].commands[service].module).register(parser)
    return {env_name(option): option for action in parser._actions
            for option in action.option_strings if option.startswith("--") and option != "--help"}


def parse_serve(command: list[str], env: Mapping[str, str]) -> argparse.Namespace:
    """``command`` (e.g. ``["serve", "decode"]``) parsed as the CLI does with ``env`` set."""
    with only_environment(env):
        return build_parser(command).parse_args(command)


@contextlib.contextmanager
def only_environment(env: Mapping[str, str]) -> Iterator[None]:
    """os.environ without any SNAPSTREAM_* variable of the outer shell, plus ``env``."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update({k: v for k, v in saved.items() if not k.startswith("SNAPSTREAM_")})
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
