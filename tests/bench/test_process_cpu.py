"""CPU accounting of a process tree: a runner's own server works in a child process."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.serve_profile import process_cpu_s, process_tree_cpu_s

# a parent that starts a child spinning for 1 s, then sleeps while it spins
_PARENT = """
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
                          "import time\\nend = time.time() + 1.0\\nwhile time.time() < end: pass"])
print("started", flush=True)
time.sleep(3)
child.wait()
time.sleep(30)
"""


def test_a_process_tree_counts_its_busy_child_and_the_parent_alone_does_not():
    parent = subprocess.Popen([sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout.readline().strip() == "started"
        time.sleep(0.8)  # the child has spun for most of a second, the parent has slept
        tree_live, alone_live = process_tree_cpu_s(parent.pid), process_cpu_s(parent.pid)
        time.sleep(3)  # the child has ended and the parent has waited for it
        tree_ended, alone_ended = process_tree_cpu_s(parent.pid), process_cpu_s(parent.pid)
    finally:
        parent.kill()
        parent.wait()
    assert tree_live - alone_live > 0.3  # the living child's spin
    assert tree_ended - alone_ended > 0.6  # the waited-for child's whole second
