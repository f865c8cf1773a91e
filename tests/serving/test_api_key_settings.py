"""API key settings: a file with comments or the environment, never both, keys long enough;
only digests kept; the Bearer scheme."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from serving.auth import KEYS_ENV, add_api_key_settings, api_keys_from_args

KEY, OTHER_KEY = "k" * 20 + "-first", "k" * 20 + "-second"


def _args(file: Path | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_api_key_settings(parser)
    return parser.parse_args([] if file is None else ["--api-keys-file", str(file)])


def _env(value: str | None):
    return {KEYS_ENV: value}.get if value is not None else {}.get


def test_keys_come_from_a_file_with_comments_or_from_the_environment(tmp_path):
    file = tmp_path / "keys"
    file.write_text(f"# the first client\n{KEY}\n\n  {OTHER_KEY}  \n")
    from_file = api_keys_from_args(_args(file), _env(None))
    from_env = api_keys_from_args(_args(None), _env(f"{KEY}, {OTHER_KEY}"))
    for keys in (from_file, from_env):
        assert keys.accepts(f"Bearer {KEY}") and keys.accepts(f"bearer {OTHER_KEY}")
        assert not keys.accepts("Bearer # the first client") and not keys.accepts(None)
    assert api_keys_from_args(_args(None), _env(None)) is None
    assert KEY not in repr(from_file)  # only digests are kept


@pytest.mark.parametrize(("content", "env", "message"), [
    ("# no key\n", None, "none given"),
    ("short\n", None, "shorter than 16"),
    (KEY, KEY, "both set"),
    (None, " , ", "none given"),
])
def test_unusable_key_settings_are_refused(tmp_path, content, env, message):
    file = None
    if content is not None:
        file = tmp_path / "keys"
        file.write_text(content)
    with pytest.raises(ValueError, match=message):
        api_keys_from_args(_args(file), _env(env))


def test_a_missing_keys_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"cannot read .*missing"):
        api_keys_from_args(_args(tmp_path / "missing"), _env(None))
