"""Documents with several questions each, for the document cache (compress once, ask many).

``multiquestion``: standard-library prose of about ``context_len`` tokens holding
``NUM_QUESTIONS`` facts, each a number for a distinct name in its own wording
(``phrasing.KEYED_FACTS``), at evenly spread depths ``(i + 1) / (NUM_QUESTIONS + 1)`` in drawn
order; each question asks for one name's number (scorer ``values``). The document is the
intro and the context: what a client sends once and asks about many times.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaldata import values
from evaldata.layout import Draft, Insert, PromptSpec, build_sample
from evaldata.phrasing import KEYED_FACTS, PHRASES
from evaldata.sample import Placement, TaskConfig

NUM_QUESTIONS = 5


@dataclass(frozen=True)
class Ask:
    """One question about a document: ``cue`` starts its answer (naming ``key``), ``answer``
    is the value, ``fact`` the needle's sentence as the document spells it."""

    question: str
    cue: str
    answer: str
    key: str
    fact: str


@dataclass(frozen=True)
class Document:
    text: str
    asks: tuple[Ask, ...]


def multiquestion(rng: random.Random, context_len: int, tokenizer,
                  num_questions: int = NUM_QUESTIONS) -> Document:
    """A document of about ``context_len`` tokens of ``tokenizer`` (its intro, context and one
    question, rendered raw, fit that count) and its questions, drawn from ``rng``."""
    if not 1 <= num_questions <= len(KEYED_FACTS):
        raise ValueError(f"num_questions must lie in [1, {len(KEYED_FACTS)}], "
                         f"got {num_questions}")
    phrases = PHRASES["multiquestion"]
    keys = values.distinct(rng, values.label, num_questions)
    numbers = values.distinct(rng, values.number, num_questions)
    facts = [fact.format(key=key, value=number) for fact, key, number
             in zip(rng.sample(KEYED_FACTS, num_questions), keys, numbers, strict=True)]
    asks = tuple(Ask(phrases.question.format(key=key), phrases.cue_for(Placement.AFTER, key=key),
                     number, key, fact)
                 for key, number, fact in zip(keys, numbers, facts, strict=True))
    inserts = tuple(Insert(fact, (i + 1) / (num_questions + 1), True)
                    for i, fact in enumerate(facts))
    draft = Draft(intro=phrases.intro, inserts=inserts, question=asks[0].question,
                  cue=asks[0].cue, answers=(asks[0].answer,))
    sample = build_sample("multiquestion", draft, rng, TaskConfig(context_len=context_len),
                          PromptSpec(tokenizer, "raw"))
    return Document(text=sample.body.removesuffix(f"\n\n{asks[0].question}"), asks=asks)
