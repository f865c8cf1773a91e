"""Retrieval tasks, looked up by name in ``TASKS``; each draws a :class:`Draft` from ``rng``.

- ``passkey``: the classic passkey test: one number in the repeated grass-and-sky noise.
- ``niah``: RULER's single needle: a magic number for a key, in standard-library prose.
- ``multikey``: the same, with ``num_distractors`` needles for keys that share a word with the
  asked one (``red-owl`` vs ``red-fox``) at random depths.
- ``multivalue``: ``num_values`` magic numbers for one key (the first at ``depth``, the others
  at random depths); all of them are asked for.
- ``kv``: a table of ``1 + num_distractors`` rows ``key: VALUE``; asked for one key's value.
- ``vartrack``: a chain ``VAR A = number``, then ``num_hops`` copies ``VAR B = VAR A``...,
  plus ``num_distractors`` chains like it; asked for the number the chain's last variable holds.
- ``realtext``: a sentence in the style of the documentation around it (a function's timeout)
  inside standard-library prose.

The needle holding the answer sits at ``cfg.depth``. The workloads on real text
(``codesearch``, ``paraphrase``, ``multineedle``) are described in :mod:`evaldata.workloads`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from itertools import pairwise

from evaldata import values, workloads
from evaldata.filler import corpus
from evaldata.layout import Draft, Insert, PromptSpec, build_sample
from evaldata.phrasing import PHRASES, Phrases
from evaldata.sample import Sample, TaskConfig


def passkey(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, value = PHRASES["passkey"], values.number(rng)
    return Draft(intro=phrases.intro, question=phrases.question,
                 cue=phrases.cue_for(cfg.placement),
                 answers=(value,), filler=corpus("classic"),
                 inserts=(Insert(phrases.fact.format(value=value), cfg.depth, True),))


def niah(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, key, value = PHRASES["niah"], values.label(rng), values.number(rng)
    return Draft(intro=phrases.intro, question=phrases.question.format(key=key),
                 cue=phrases.cue_for(cfg.placement, key=key), answers=(value,),
                 inserts=(Insert(phrases.fact.format(key=key, value=value), cfg.depth, True),))


def multikey(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, key = PHRASES["multikey"], values.label(rng)
    others = values.distinct(rng, lambda r: values.similar_label(r, key), cfg.num_distractors,
                             exclude=(key,))
    numbers = values.distinct(rng, values.number, 1 + cfg.num_distractors)
    inserts = [Insert(phrases.fact.format(key=key, value=numbers[0]), cfg.depth, True)]
    inserts += [Insert(phrases.fact.format(key=other, value=number), rng.random())
                for other, number in zip(others, numbers[1:], strict=True)]
    return Draft(intro=phrases.intro, question=phrases.question.format(key=key),
                 cue=phrases.cue_for(cfg.placement, key=key), answers=(numbers[0],),
                 inserts=tuple(inserts))


def multivalue(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, key = PHRASES["multivalue"], values.label(rng)
    numbers = values.distinct(rng, values.number, cfg.num_values)
    depths = [cfg.depth, *(rng.random() for _ in numbers[1:])]
    inserts = tuple(Insert(phrases.fact.format(key=key, value=number), depth, True)
                    for number, depth in zip(numbers, depths, strict=True))
    return Draft(intro=phrases.intro, question=phrases.question.format(key=key),
                 cue=phrases.cue_for(cfg.placement, key=key), answers=numbers, inserts=inserts)


def kv(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases = PHRASES["kv"]
    keys = values.distinct(rng, values.kv_key, 1 + cfg.num_distractors)
    table = values.distinct(rng, values.kv_value, len(keys))
    asked = rng.randrange(len(keys))
    rows = "\n".join(phrases.fact.format(key=k, value=v) for k, v in zip(keys, table, strict=True))
    return Draft(intro=phrases.intro, question=phrases.question.format(key=keys[asked]),
                 cue=phrases.cue_for(cfg.placement, key=keys[asked]), answers=(table[asked],),
                 inserts=(Insert(f"\n{rows}\n", cfg.depth, True),))


def vartrack(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases = PHRASES["vartrack"]
    num_chains, chain_len = 1 + cfg.num_distractors, 1 + cfg.num_hops
    names = values.distinct(rng, values.var_name, num_chains * chain_len)
    numbers = values.distinct(rng, values.number, num_chains)
    inserts: list[Insert] = []
    for c, number in enumerate(numbers):
        chain = names[c * chain_len : (c + 1) * chain_len]
        root_depth = cfg.depth if c == 0 else rng.random()
        inserts += _chain(rng, phrases, chain, number, root_depth, is_target=c == 0)
    asked = names[chain_len - 1]
    return Draft(intro=phrases.intro, question=phrases.question.format(name=asked),
                 cue=phrases.cue_for(cfg.placement, name=asked), answers=(numbers[0],),
                 inserts=tuple(inserts))


def _chain(rng: random.Random, phrases: Phrases, names: tuple[str, ...], number: str,
           root_depth: float, *, is_target: bool) -> list[Insert]:
    """``names[0] = number`` at ``root_depth``, then each name copies the previous one, in order,
    at random depths after it."""
    statements = [phrases.fact.format(name=names[0], value=number)]
    statements += [phrases.link.format(name=name, src=src) for src, name in pairwise(names)]
    depths = [root_depth, *sorted(rng.uniform(root_depth, 1.0) for _ in names[1:])]
    return [Insert(text, depth, is_target)
            for text, depth in zip(statements, depths, strict=True)]


def realtext(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, name, value = PHRASES["realtext"], values.function_name(rng), values.number(rng)
    return Draft(intro=phrases.intro, question=phrases.question.format(name=name),
                 cue=phrases.cue_for(cfg.placement, name=name), answers=(value,),
                 inserts=(Insert(phrases.fact.format(name=name, value=value), cfg.depth, True),))


TASKS: dict[str, Callable[[random.Random, TaskConfig], Draft]] = {
    "passkey": passkey, "niah": niah, "multikey": multikey, "multivalue": multivalue,
    "kv": kv, "vartrack": vartrack, "realtext": realtext,
    # on real text (evaldata.workloads)
    "codesearch": workloads.codesearch, "paraphrase": workloads.paraphrase,
    "multineedle": workloads.multineedle,
}


def generate(task: str, rng: random.Random, cfg: TaskConfig, spec: PromptSpec) -> Sample:
    """One sample of ``task`` fitted to ``cfg.context_len`` tokens of ``spec``'s tokenizer;
    everything random in it comes from ``rng``."""
    if task not in TASKS:
        raise ValueError(f"task must be one of {', '.join(TASKS)}, got {task!r}")
    draft = TASKS[task](rng, cfg)
    return build_sample(task, draft, rng, cfg, spec)
