"""/proc helpers to prove no process outlives a test."""

from __future__ import annotations

from pathlib import Path


def process_identity(pid: int) -> tuple[int, int] | None:
    """(pid, start time in clock ticks) of a live process, None when it is gone; the start time
    tells a process from a later one that reuses its pid."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = stat.rsplit(")", 1)[1].split()  # after "pid (comm)": state, ppid, ...
    if fields[0] == "Z":  # a zombie has ended; its parent has not reaped it yet
        return None
    return pid, int(fields[19])  # field 22 of stat: starttime


def descendants(pid: int) -> set[tuple[int, int]]:
    """Identities of every live process below ``pid``."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (FileNotFoundError, ProcessLookupError):
                continue
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = set(), list(children.get(pid, []))
    while todo:
        child = todo.pop()
        if (identity := process_identity(child)) is not None:
            found.add(identity)
        todo.extend(children.get(child, []))
    return found


def process_trees(pids: list[int]) -> set[tuple[int, int]]:
    """Identities of the live processes among ``pids`` and every process below them."""
    roots = {identity for pid in pids if (identity := process_identity(pid)) is not None}
    return roots.union(*(descendants(pid) for pid in pids))


def still_running(identities: set[tuple[int, int]]) -> set[tuple[int, int]]:
    return {identity for identity in identities if process_identity(identity[0]) == identity}
