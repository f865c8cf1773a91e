"""The JSON-lines runner protocol: messages, the runner loop, and RunnerProcess against a real
runner process (a script that serves the protocol with the project's own python)."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import bench
from bench.peers.process import RunnerError, RunnerProcess
from bench.peers.runners import RUNNERS
from bench.peers.runners.peer_protocol import (
    ProtocolError,
    Reply,
    Request,
    generation_reply,
    median,
    serve,
)
from bench.peers.systems import get_system


def test_request_and_reply_round_trip():
    request = Request(7, "generate", {"prompt_ids": [1, 2, 3], "max_new_tokens": 4})
    assert Request.decode(request.encode()) == request
    assert request.encode().endswith("\n") and request.encode().count("\n") == 1
    ok, failed = Reply(7, True, {"token_ids": [5]}), Reply(8, False, error="ValueError: x")
    assert Reply.decode(ok.encode()) == ok
    assert Reply.decode(failed.encode()) == failed
    assert "result" not in json.loads(failed.encode())


@pytest.mark.parametrize("line", ["not json", "[1, 2]", '{"op": "hello"}', '{"id": 1}',
                                  '{"id": "1", "op": "hello"}', '{"id": 1, "op": "x", "args": 3}'])
def test_malformed_requests_are_refused(line):
    with pytest.raises(ProtocolError):
        Request.decode(line)


def test_serve_answers_in_order_and_survives_errors():
    def boom(args):
        raise ValueError(f"bad {args['x']}")

    lines = [Request(1, "echo", {"x": 1}).encode(), "garbage\n",
             Request(2, "boom", {"x": 2}).encode(), Request(3, "nope").encode(),
             Request(4, "shutdown").encode(), Request(5, "echo", {"x": 5}).encode()]
    out = io.StringIO()
    serve({"echo": lambda args: {"x": args["x"]}, "boom": boom}, io.StringIO("".join(lines)), out)
    replies = [Reply.decode(line) for line in out.getvalue().splitlines()]

    assert [(r.id, r.ok) for r in replies] == [(1, True), (-1, False), (2, False), (3, False),
                                               (4, True)]  # nothing after shutdown
    assert replies[0].result == {"x": 1}
    assert replies[2].error == "ValueError: bad 2" and "Traceback" in replies[2].traceback
    assert "unknown op 'nope'" in replies[3].error and "echo" in replies[3].error


def test_generation_reply_times_ttft_and_median_gap():
    reply = generation_reply(start=10.0, stamps=[10.5, 10.6, 10.8, 10.9], token_ids=[4, 5, 6, 7],
                             kv_bytes=123, kv_note="n")
    assert reply["ttft_ms"] == pytest.approx(500.0)
    assert reply["decode_ms_per_token"] == pytest.approx(100.0)  # gaps 100, 200, 100
    assert reply["token_ids"] == [4, 5, 6, 7] and reply["peak_rss_bytes"] > 0
    with pytest.raises(ValueError):
        generation_reply(start=0.0, stamps=[1.0], token_ids=[1], kv_bytes=None, kv_note="")
    assert median([3.0, 1.0, 2.0, 10.0]) == 2.5


RUNNER = """
    import os, sys, time
    sys.path.insert(0, {protocol_dir!r})
    from peer_protocol import serve

    def hello(args):
        print("library noise on stdout")  # must not reach the reply stream
        return {{"system": "toy", "pid": os.getpid(), "versions": {{}}}}

    def fail(args):
        raise RuntimeError("out of memory")

    def sleep(args):
        time.sleep(args["s"])
        return {{}}

    def die(args):
        print("dying now", file=sys.stderr, flush=True)
        os._exit(3)

    serve({{"hello": hello, "add": lambda a: {{"sum": a["x"] + a["y"]}}, "fail": fail,
           "sleep": sleep, "die": die,
           "pythonpath": lambda a: {{"value": os.environ.get("PYTHONPATH")}}}})
"""


@pytest.fixture
def toy_runner(tmp_path):
    script = tmp_path / "run_toy.py"
    script.write_text(textwrap.dedent(RUNNER.format(protocol_dir=str(RUNNERS))))
    return script


def test_runner_process_calls_a_real_runner(toy_runner, tmp_path):
    log = tmp_path / "logs" / "toy.log"
    with RunnerProcess(sys.executable, toy_runner, log) as runner:
        assert runner.hello["system"] == "toy"
        assert runner.call("add", x=2, y=3) == {"sum": 5}
        with pytest.raises(RunnerError, match="fail failed: RuntimeError: out of memory"):
            runner.call("fail")
        assert runner.call("add", x=1, y=1) == {"sum": 2}  # an error reply leaves it alive
    assert "library noise on stdout" in log.read_text()


def test_a_runner_sees_a_pythonpath_only_when_its_system_gives_one(toy_runner, tmp_path,
                                                                   monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/the/benchmark/s/own")
    with RunnerProcess(sys.executable, toy_runner, tmp_path / "toy.log") as runner:
        assert runner.call("pythonpath") == {"value": None}
    snapstream_env = get_system("snapstream").runner_env(None)
    with RunnerProcess(sys.executable, toy_runner, tmp_path / "toy.log",
                       env=snapstream_env) as runner:  # this checkout, not the editable one
        assert runner.call("pythonpath") == {"value": str(Path(bench.__file__).parents[1])}


def test_runner_process_reports_a_dead_runner_with_its_log(toy_runner, tmp_path):
    with RunnerProcess(sys.executable, toy_runner, tmp_path / "toy.log") as runner:
        with pytest.raises(RunnerError, match=r"exited \(3\) during 'die'.*dying now"):
            runner.call("die")
        with pytest.raises(RunnerError, match=r"gone|exited"):
            runner.call("add", x=1, y=2)


def test_runner_process_kills_a_runner_that_times_out(toy_runner, tmp_path):
    with RunnerProcess(sys.executable, toy_runner, tmp_path / "toy.log") as runner:
        with pytest.raises(RunnerError, match="no reply to 'sleep' within 1 s; killed it"):
            runner.call("sleep", timeout_s=1, s=30)
        assert runner._proc.poll() is not None


def test_a_runner_dies_with_the_process_that_started_it(toy_runner, tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            from bench.peers.process import RunnerProcess
            runner = RunnerProcess(sys.executable, {str(toy_runner)!r}, {str(tmp_path / "t.log")!r})
            print(runner.pid, flush=True)
            time.sleep(60)
        """)], stdout=subprocess.PIPE, text=True)
    runner_pid = int(parent.stdout.readline())
    parent.kill()  # no clean-up code runs in the parent
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(runner_pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(runner_pid)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
