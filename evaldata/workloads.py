"""Workloads on real text, registered in ``evaldata.tasks.TASKS`` beside the synthetic tasks;
each draws a :class:`Draft` from the sample's generator.

- ``codesearch`` (RepoQA-style): real Python source files (:mod:`evaldata.codebase`), the
  asked function's file slice at ``cfg.depth``; the question describes the function in
  reworded form (:mod:`evaldata.describe`); the answer is its name (scorer ``name``).
- ``paraphrase``: one fact in standard-library prose at ``cfg.depth``, asked by a question that
  shares no content word with it (:mod:`evaldata.paraphrases`); the answer is its number.
- ``multineedle``: ``MULTI_NEEDLES`` (2 to 4, drawn) facts for distinct names, each in its own
  wording (``KEYED_FACTS``), the first at ``cfg.depth`` and the others at drawn depths; the
  question asks for every one of them (scorer ``all_values``: all numbers present).

The multi-question workload is a document with several questions (:mod:`evaldata.document`).
"""

from __future__ import annotations

import functools
import random

from evaldata import values
from evaldata.codebase import MAX_BLOCK_CHARS, Target, haystack, target_block, targets
from evaldata.layout import Draft, Insert
from evaldata.paraphrases import PARAPHRASES
from evaldata.phrasing import KEYED_FACTS, PHRASES
from evaldata.sample import TaskConfig

MULTI_NEEDLES = (2, 4)


def codesearch(rng: random.Random, cfg: TaskConfig) -> Draft:
    """Blocks hold at most half the context's length in characters and ``MAX_BLOCK_CHARS``."""
    phrases = PHRASES["codesearch"]
    max_chars = min(MAX_BLOCK_CHARS, cfg.context_len // 2)
    pool = _code_targets(max_chars)
    if not pool:
        raise ValueError(f"context_len={cfg.context_len} is too small for codesearch: no "
                         f"function fits in {max_chars} characters")
    target, block = rng.choice(pool)
    return Draft(intro=phrases.intro, inserts=(Insert(block, cfg.depth, True),),
                 question=phrases.question.format(description=target.description),
                 cue=phrases.cue_for(cfg.placement), answers=(target.name,),
                 filler=haystack(rng, target, max_chars), scoring="name")


@functools.cache
def _code_targets(max_chars: int) -> tuple[tuple[Target, str], ...]:
    """Every code-search target whose block fits in ``max_chars`` characters, with the block."""
    phrases = PHRASES["codesearch"]
    fixed = " ".join((phrases.intro, phrases.question, phrases.cue, phrases.blind_cue))
    return tuple((t, block) for t in targets(fixed) if (block := target_block(t, max_chars)))


def paraphrase(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases, pair, value = PHRASES["paraphrase"], rng.choice(PARAPHRASES), values.number(rng)
    return Draft(intro=phrases.intro, question=pair.question, cue=phrases.cue_for(cfg.placement),
                 answers=(value,),
                 inserts=(Insert(pair.fact.format(value=value), cfg.depth, True),))


def multineedle(rng: random.Random, cfg: TaskConfig) -> Draft:
    phrases = PHRASES["multineedle"]
    count = rng.randint(*MULTI_NEEDLES)
    keys = values.distinct(rng, values.label, count)
    numbers = values.distinct(rng, values.number, count)
    facts = rng.sample(KEYED_FACTS, count)
    depths = [cfg.depth, *(rng.random() for _ in keys[1:])]
    inserts = tuple(Insert(fact.format(key=key, value=number), depth, True)
                    for fact, key, number, depth in zip(facts, keys, numbers, depths, strict=True))
    listed = listing(keys)
    return Draft(intro=phrases.intro, question=phrases.question.format(keys=listed),
                 cue=phrases.cue_for(cfg.placement, keys=listed), answers=numbers,
                 inserts=inserts, scoring="all_values")


def listing(words: tuple[str, ...]) -> str:
    """``a``, ``a and b``, ``a, b and c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
