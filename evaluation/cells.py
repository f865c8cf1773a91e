"""`snapstream eval` in resumable pieces: the rows of each (task, context length, placement)
cell go to ``<out>/cells/<task>-<length>-<placement>.json`` as soon as the cell is done, and a
later run into the same ``--out`` reads the cells already there instead of running them again.
A long grid can so be stopped and resumed, or grown by tasks, lengths and placements (its other
settings fixed): ``cells/settings.json`` holds the model and the configuration less
``GRID_AXES``, and a run with other settings refuses the directory.

Each cell runs alone (its samples prefilled once, every run decoded from that prefill), so a
cell's rows are those a run of the whole grid gives it: rows keep the sample's index in the
grid, which also seeds a gap's prose.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path

from evaldata import Sample
from evaluation.results import Row

CELLS = "cells"
SETTINGS = "settings.json"
GRID_AXES = ("tasks", "context_lens", "placements", "limit")

# (the cell's samples' indices in the grid, the samples) -> (rows, speculative skips)
CellRun = Callable[[list[int], list[Sample]], tuple[list[Row], list[dict]]]


def cell_name(sample: Sample) -> str:
    return f"{sample.task}-{sample.context_len}-{sample.placement}"


def run_in_cells(samples: Sequence[Sample], settings: dict, out: Path, run: CellRun,
                 echo: Callable[[str], object] = print) -> tuple[list[Row], list[dict]]:
    """Every cell's rows and skips, in the samples' order of cells: read from ``out`` where a
    cell is done, else ``run`` and written. ``settings``: the model and the configuration
    (:data:`GRID_AXES` are left out of the check)."""
    directory = out / CELLS
    _check_settings(directory, settings)
    cells: dict[str, list[int]] = {}
    for index, sample in enumerate(samples):
        cells.setdefault(cell_name(sample), []).append(index)
    rows: list[Row] = []
    skipped: list[dict] = []
    for name, indices in cells.items():
        path = directory / f"{name}.json"
        if path.exists():
            done = json.loads(path.read_text())
            echo(f"cell {name}: read {len(done['rows'])} rows from {path}")
        else:
            cell_rows, cell_skipped = run(indices, [samples[i] for i in indices])
            done = {"rows": [asdict(row) for row in cell_rows], "skipped": cell_skipped}
            partial = path.with_suffix(".partial")
            partial.write_text(json.dumps(done) + "\n")
            partial.replace(path)  # a cell file is whole or absent
            echo(f"cell {name}: wrote {len(cell_rows)} rows to {path}")
        rows += [Row(**row) for row in done["rows"]]
        skipped += done["skipped"]
    return rows, skipped


def _check_settings(directory: Path, settings: dict) -> None:
    fixed = json.loads(json.dumps({k: v for k, v in settings.items() if k not in GRID_AXES}))
    path = directory / SETTINGS
    if not path.exists():
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fixed, indent=1, sort_keys=True) + "\n")
        return
    stored = json.loads(path.read_text())
    differ = sorted(k for k in stored.keys() | fixed.keys() if stored.get(k) != fixed.get(k))
    if differ:
        raise ValueError(f"--out: {directory} holds cells of other settings ({', '.join(differ)}"
                         f": there {[stored.get(k) for k in differ]}, now "
                         f"{[fixed.get(k) for k in differ]}); give another --out, or delete "
                         f"{directory} to start over")
