"""RULER-style retrieval tasks, looked up by name in ``TASKS``.

- ``passkey``: one number hidden in filler; asked for the number.
- ``multikey``: ``1 + num_distractors`` facts ``key -> number`` whose keys share a word with the
  asked one (``red-owl`` vs ``red-fox``); distractors sit at random depths.
- ``kv``: a table of ``1 + num_distractors`` rows ``key: VALUE``; asked for one key's value.
- ``vartrack``: a chain ``A = number``, then ``num_hops`` copies ``B = A``, ``C = B``...,
  plus ``num_distractors`` chains like it; asked for the number the chain's last variable holds.
  The chain's first statement sits at ``depth`` and its copies at random depths after it.

The needle holding the answer is placed at ``cfg.depth``. Target needles are those the answer
needs: the one holding it, and for vartrack every statement of the asked chain. Follow-ups ask
the same question about every distractor (passkey has none).

Each task also names its largest sample (the longest wordings and values), so that
``min_context_len`` can tell up front whether a context length fits every sample.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import pairwise

from snapstream.data import layout, values
from snapstream.data.layout import Insert, build_sample
from snapstream.data.phrasing import PHRASES, Phrases
from snapstream.data.sample import Sample, Split, TaskConfig


def passkey(rng: random.Random, cfg: TaskConfig) -> Sample:
    phrases = PHRASES["passkey"][cfg.split]
    fact, question = rng.choice(phrases.facts), rng.choice(phrases.questions)
    answer = values.number(rng)
    return build_sample(
        task="passkey", rng=rng, cfg=cfg, question=question, answer=answer,
        inserts=[Insert(fact.format(value=answer), cfg.depth, is_target=True)],
    )


def multikey(rng: random.Random, cfg: TaskConfig) -> Sample:
    phrases = PHRASES["multikey"][cfg.split]
    fact, question = rng.choice(phrases.facts), rng.choice(phrases.questions)
    key = values.label(rng)
    distractor_keys = values.distinct(
        rng, lambda r: values.similar_label(r, key), cfg.num_distractors, exclude=(key,)
    )
    numbers = values.distinct(rng, values.number, 1 + cfg.num_distractors)
    inserts = [Insert(fact.format(key=key, value=numbers[0]), cfg.depth, is_target=True)]
    inserts += [
        Insert(fact.format(key=other, value=number), rng.random())
        for other, number in zip(distractor_keys, numbers[1:], strict=True)
    ]
    return build_sample(
        task="multikey", rng=rng, cfg=cfg, inserts=inserts,
        question=question.format(key=key), answer=numbers[0],
        followups=[(question.format(key=other), number)
                   for other, number in zip(distractor_keys, numbers[1:], strict=True)],
    )


def kv(rng: random.Random, cfg: TaskConfig) -> Sample:
    phrases = PHRASES["kv"][cfg.split]
    intro, row = rng.choice(phrases.intros), rng.choice(phrases.facts)
    question = rng.choice(phrases.questions)
    keys = values.distinct(rng, values.kv_key, 1 + cfg.num_distractors)
    table = values.distinct(rng, values.kv_value, len(keys))
    asked = rng.randrange(len(keys))
    rows = (row.format(key=key, value=value) for key, value in zip(keys, table, strict=True))
    block = "\n".join((intro, *rows)) + "\n"
    return build_sample(
        task="kv", rng=rng, cfg=cfg, inserts=[Insert(block, cfg.depth, is_target=True)],
        question=question.format(key=keys[asked]), answer=table[asked],
        followups=[(question.format(key=key), value)
                   for i, (key, value) in enumerate(zip(keys, table, strict=True)) if i != asked],
    )


def vartrack(rng: random.Random, cfg: TaskConfig) -> Sample:
    phrases = PHRASES["vartrack"][cfg.split]
    style = rng.randrange(len(phrases.facts))
    question = rng.choice(phrases.questions)
    num_chains, chain_len = 1 + cfg.num_distractors, 1 + cfg.num_hops
    names = values.distinct(rng, values.var_name, num_chains * chain_len)
    numbers = values.distinct(rng, values.number, num_chains)
    inserts: list[Insert] = []
    for c, number in enumerate(numbers):
        chain = names[c * chain_len : (c + 1) * chain_len]
        root_depth = cfg.depth if c == 0 else rng.random()
        inserts += _chain(rng, phrases, style, chain, number, root_depth, is_target=c == 0)
    return build_sample(
        task="vartrack", rng=rng, cfg=cfg, inserts=inserts,
        question=question.format(name=names[chain_len - 1]), answer=numbers[0],
        followups=[(question.format(name=names[(c + 1) * chain_len - 1]), number)
                   for c, number in enumerate(numbers[1:], start=1)],
    )


def _chain(
    rng: random.Random, phrases: Phrases, style: int, names: tuple[str, ...], number: str,
    root_depth: float, *, is_target: bool,
) -> list[Insert]:
    """``names[0] = number`` at ``root_depth``, then each name copies the previous one, in order,
    at random depths after it."""
    statements = [phrases.facts[style].format(name=names[0], value=number)]
    statements += [phrases.links[style].format(name=name, src=src) for src, name in pairwise(names)]
    depths = [root_depth, *sorted(rng.uniform(root_depth, 1.0) for _ in names[1:])]
    return [
        Insert(text, depth, is_target=is_target)
        for text, depth in zip(statements, depths, strict=True)
    ]


def _longest(texts: Iterable[str]) -> str:
    return max(texts, key=len)


def passkey_largest(phrases: Phrases, num_distractors: int, num_hops: int
                    ) -> tuple[str, list[str]]:
    fact = _longest(f.format(value=values.LONGEST_NUMBER) for f in phrases.facts)
    return _longest(phrases.questions), [fact]


def multikey_largest(phrases: Phrases, num_distractors: int, num_hops: int
                     ) -> tuple[str, list[str]]:
    key, value = values.LONGEST_LABEL, values.LONGEST_NUMBER
    fact = _longest(f.format(key=key, value=value) for f in phrases.facts)
    return _longest(q.format(key=key) for q in phrases.questions), [fact] * (1 + num_distractors)


def kv_largest(phrases: Phrases, num_distractors: int, num_hops: int) -> tuple[str, list[str]]:
    key, value = values.LONGEST_KV_KEY, values.LONGEST_KV_VALUE
    row = _longest(f.format(key=key, value=value) for f in phrases.facts)
    block = "\n".join((_longest(phrases.intros), *[row] * (1 + num_distractors))) + "\n"
    return _longest(q.format(key=key) for q in phrases.questions), [block]


def vartrack_largest(phrases: Phrases, num_distractors: int, num_hops: int
                     ) -> tuple[str, list[str]]:
    name, value = values.LONGEST_VAR_NAME, values.LONGEST_NUMBER
    chains = ([fact.format(name=name, value=value)] + [link.format(name=name, src=name)] * num_hops
              for fact, link in zip(phrases.facts, phrases.links, strict=True))
    chain = max(chains, key=lambda statements: sum(len(s) + 1 for s in statements))
    return (_longest(q.format(name=name) for q in phrases.questions),
            chain * (1 + num_distractors))


@dataclass(frozen=True)
class Task:
    """``generate`` builds a sample; ``largest`` gives the longest question and needles a
    sample with ``num_distractors`` and ``num_hops`` can draw from ``phrases``."""

    generate: Callable[[random.Random, TaskConfig], Sample]
    largest: Callable[[Phrases, int, int], tuple[str, list[str]]]


TASKS: dict[str, Task] = {
    "passkey": Task(passkey, passkey_largest),
    "multikey": Task(multikey, multikey_largest),
    "kv": Task(kv, kv_largest),
    "vartrack": Task(vartrack, vartrack_largest),
}


def _task(task: str) -> Task:
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    return TASKS[task]


def generate(task: str, rng: random.Random, cfg: TaskConfig) -> Sample:
    """One sample of ``task``; everything random in it comes from ``rng``."""
    return _task(task).generate(rng, cfg)


@functools.cache
def min_context_len(task: str, split: Split, num_distractors: int, num_hops: int) -> int:
    """The shortest ``context_len`` at which every sample of ``task`` with these counts builds,
    whatever wordings and values it draws."""
    question, needles = _task(task).largest(PHRASES[task][split], num_distractors, num_hops)
    return layout.context_len_for(question, needles)
