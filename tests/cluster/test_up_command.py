"""`snapstream up` as a process: SIGTERM stops the cluster and leaves no process behind."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.cluster.helpers import descendants, still_running

pytestmark = pytest.mark.slow
START_TIMEOUT_S = 180.0


def _read_until(process: subprocess.Popen, marker: str, timeout_s: float) -> str:
    """stdout of ``process`` up to and including the first empty line after ``marker``."""
    text, deadline = "", time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while marker not in text or "\n\n" not in text.split(marker, 1)[1]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or process.poll() is not None:
                raise AssertionError(f"no {marker!r} (exit {process.poll()}):\n{text}")
            if selector.select(remaining):
                text += os.read(process.stdout.fileno(), 65536).decode()
    return text


def test_sigterm_stops_every_member(tiny_model: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "cli.main", "up", "--store", "redis", "--model",
               str(tiny_model), "--port", "0", "--http-port", "0", "--rows", "2",
               "--log-dir", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        printed = _read_until(process, "snapstream cluster is up", START_TIMEOUT_S)
        members = descendants(process.pid)
        assert len(members) == 5, members  # store, prefill, 2 decode, router
        base_url = re.search(r"  openai    (http://127\.0\.0\.1:\d+/v1)\n", printed).group(1)
        with urllib.request.urlopen(f"{base_url}/models", timeout=10) as response:
            assert json.load(response)["data"][0]["id"] == tiny_model.name
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0, process.stderr.read().decode()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    for name in ("store", "prefill", "decode-0", "decode-1", "router"):
        assert f"  {name} " in printed
    assert still_running(members) == set()
    assert "SIGTERM: stopping the cluster" in process.stderr.read().decode()


@pytest.mark.parametrize("flag", ["--tls", "--api-key", "--api-keys-file=keys"])
def test_the_plaintext_demo_is_refused_with_tls_or_a_key(flag: str) -> None:
    result = subprocess.run([sys.executable, "-m", "cli.main", "up", "--demo", flag],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: --demo speaks plaintext without a key: leave out "
                                     "--tls, --api-key and --api-keys-file")


def _post(url: str, body: dict) -> tuple[int, dict]:
    request = urllib.request.Request(url, data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


def test_auto_starts_the_targets_default_draft(tmp_path: Path) -> None:
    """`up --draft-model auto` on the default model: its prefill worker drafts with the
    registry's default draft (Gemma 3 270M for SmolLM2), which a request may ask for by
    'auto' or by name; another model's name is refused with 412, naming it."""
    command = [sys.executable, "-m", "cli.main", "up", "--store", "redis", "--draft-model",
               "auto", "--port", "0", "--http-port", "0", "--decode-workers", "1", "--rows",
               "2", "--log-dir", str(tmp_path)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        printed = _read_until(process, "snapstream cluster is up", START_TIMEOUT_S)
        base_url = re.search(r"  openai    (http://127\.0\.0\.1:\d+/v1)\n", printed).group(1)
        with urllib.request.urlopen(f"{base_url}/models", timeout=10) as response:
            model = json.load(response)["data"][0]["id"]
        prompt = " ".join(f"Item {i} costs {i * 37 % 1000} coins." for i in range(80))
        body = {"model": model, "prompt": prompt, "max_tokens": 2, "temperature": 0}
        for name in ("auto", "gemma3-270m"):
            extension = {"speculative": {"keep": 0.25, "chunk_size": 32, "draft_model": name}}
            status, reply = _post(f"{base_url}/completions", {**body, "snapstream": extension})
            assert status == 200, reply
            report = reply["snapstream"]["speculative"]
            assert report["kept_tokens"] < report["prompt_tokens"] and not report["skipped"]
        extension = {"speculative": {"keep": 0.25, "draft_model": "qwen2.5-coder-0.5b"}}
        status, reply = _post(f"{base_url}/completions", {**body, "snapstream": extension})
        assert status == 412 and "drafts with" in reply["error"]["message"]
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
