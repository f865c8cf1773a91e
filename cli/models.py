"""`snapstream models list|pull`: the named models, installed or not, and installing them."""

from __future__ import annotations

import argparse
import json
import sys

from tqdm import tqdm

from snapstream.checkpoints.model_sources import PullError
from snapstream.checkpoints.registry import MODELS, named_model


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, parser_class=type(parser))
    listing = sub.add_parser("list", help="each named model: installed or not, size, "
                             "architecture, context, license and provenance")
    listing.add_argument("--json", action="store_true", help="one JSON object per model")
    pull = sub.add_parser("pull", help="download, check (SHA-256) and put a model in place; "
                          "skips what is already done")
    pull.add_argument("names", nargs="+", metavar="NAME", help="model names (see `list`)")


def _rows() -> list[dict]:
    return [{"name": model.name, "installed": model.is_installed(),
             "title": model.card.title, "size": model.card.size,
             "architecture": model.card.architecture, "context": model.card.context,
             "license": model.card.license, "gguf_name": model.card.gguf_name,
             "packages": list(model.packages),
             "package_summary": model.package_summary, "sha256": model.card.sha256,
             "origin": model.card.origin, "draft": model.draft} for model in MODELS.values()]


def _list(as_json: bool) -> None:
    rows = _rows()
    if as_json:
        for row in rows:
            print(json.dumps(row))
        return
    header = ("name", "installed", "size", "arch", "context", "license", "default draft")
    table = [(r["name"], "yes" if r["installed"] else "no", f"{r['size'] / 2**20:,.0f} MiB",
              r["architecture"], f"{r['context']:,}", r["license"], r["draft"]) for r in rows]
    widths = [max(len(str(cell)) for cell in column) for column in zip(header, *table,
                                                                       strict=True)]
    for line in (header, *table):
        print("  ".join(str(cell).ljust(width) for cell, width in zip(line, widths,
                                                                      strict=True)).rstrip())
    print()
    for r in rows:
        print(f"{r['name']}: {r['title']}, GGUF \"{r['gguf_name']}\", {r['origin']}; "
              f"PyPI {r['package_summary']}; sha256 {r['sha256']}")


def _pull(names: list[str]) -> int:
    models = [named_model(name) for name in dict.fromkeys(names)]  # all checked before any work
    for model in models:
        with tqdm(total=model.card.size, desc=model.name, unit="B", unit_scale=True,
                  unit_divisor=1024, file=sys.stderr, leave=True) as bar:
            try:
                pulled = model.pull(bar.update)
            except PullError as exc:
                bar.close()
                print(f"error: {exc}", file=sys.stderr)
                return 1
            if not pulled:
                bar.update(model.card.size - bar.n)
        what = "pulled" if pulled else "already installed"
        print(f"{model.name}: {what}, sha256 {model.card.sha256[:12]}... checked: "
              f"{model.path()}")
    return 0


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        _list(args.json)
        return 0
    return _pull(args.names)
