"""Tables of the kvpress comparison: token parity per pair and budget, accuracy per system."""

from __future__ import annotations

from collections import defaultdict

from bench.report import markdown_table


def parity(records: list[dict], pairs: tuple[tuple[str, str], ...]) -> list[dict]:
    """For each (kvpress system, snapstream system) and budget: prompts with identical greedy
    tokens, of those both systems answered."""
    tokens = {(r["system"], r["budget"], r["sample"]): r["token_ids"] for r in records}
    budgets = list(dict.fromkeys(r["budget"] for r in records))
    entries = []
    for theirs, ours in pairs:
        for budget in budgets:
            samples = [s for (name, b, s) in tokens if name == theirs and b == budget
                       and (ours, budget, s) in tokens]
            if not samples:
                continue
            same = sum(tokens[(theirs, budget, s)] == tokens[(ours, budget, s)]
                       for s in samples)
            entries.append({"kvpress": theirs, "snapstream": ours, "budget": budget,
                            "identical": same, "n": len(samples)})
    return entries


def accuracy(records: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str | None], list[bool]] = defaultdict(list)
    for record in records:
        groups[(record["system"], record["budget"])].append(record["correct"])
    return [{"system": system, "budget": budget, "correct": sum(hits), "n": len(hits)}
            for (system, budget), hits in groups.items()]


def render(parity_entries: list[dict], accuracy_entries: list[dict]) -> str:
    body = [[e["kvpress"], e["snapstream"], e["budget"] or "-",
             f"{e['identical']}/{e['n']} ({e['identical'] / e['n']:.0%})"]
            for e in parity_entries]
    out = "token parity (greedy tokens identical)\n"
    out += markdown_table(["kvpress", "snapstream", "budget", "identical"], body)
    budgets = list(dict.fromkeys(e["budget"] for e in accuracy_entries))
    systems = list(dict.fromkeys(e["system"] for e in accuracy_entries))
    cells = {(e["system"], e["budget"]): e for e in accuracy_entries}
    rows = [[system, *(_cell(cells.get((system, b))) for b in budgets)] for system in systems]
    out += "\n\naccuracy (exact match)\n"
    out += markdown_table(["system", *(b or "full" for b in budgets)], rows)
    return out


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "-"
    return f"{entry['correct'] / entry['n']:.2f} ({entry['correct']}/{entry['n']})"
