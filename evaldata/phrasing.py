"""Wordings of each task: the classic passkey test's, RULER's (Hsieh et al., 2024) for the
needle tasks, and a documentation sentence for the real-text task.

Templates are ``str.format`` patterns over ``{key}``, ``{value}``, ``{name}`` and ``{src}``.
``cue`` starts the answer when the question comes after the context; ``blind_cue`` does so when
it comes before, and names no key, so the end of the prompt (SnapKV's observation window) does
not tell which needle is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Phrases:
    """``fact`` states a value; ``link`` (vartrack) copies one variable into another; ``row``
    (kv) is a table row; ``intro`` opens the prompt."""

    intro: str
    fact: str
    question: str
    cue: str
    blind_cue: str
    link: str = ""

    def __post_init__(self) -> None:
        for name in ("intro", "fact", "question", "cue", "blind_cue"):
            if not getattr(self, name):
                raise ValueError(f"{name} must not be empty")


_RULER_INTRO = ("Some special magic numbers are hidden within the following text. Make sure "
                "to memorize it. I will quiz you about the numbers afterwards.")

PHRASES: dict[str, Phrases] = {
    "passkey": Phrases(
        intro=("There is an important info hidden inside a lot of irrelevant text. Find it and "
               "memorize them. I will quiz you about the important information there."),
        fact="The pass key is {value}. Remember it. {value} is the pass key.",
        question="What is the pass key?",
        cue="The pass key is", blind_cue="The pass key is"),
    "niah": Phrases(
        intro=_RULER_INTRO,
        fact="One of the special magic numbers for {key} is: {value}.",
        question="What is the special magic number for {key} mentioned in the provided text?",
        cue="The special magic number for {key} mentioned in the provided text is",
        blind_cue="The special magic number mentioned in the provided text is"),
    "multikey": Phrases(
        intro=_RULER_INTRO,
        fact="One of the special magic numbers for {key} is: {value}.",
        question="What is the special magic number for {key} mentioned in the provided text?",
        cue="The special magic number for {key} mentioned in the provided text is",
        blind_cue="The special magic number asked for is"),
    "multivalue": Phrases(
        intro=_RULER_INTRO,
        fact="One of the special magic numbers for {key} is: {value}.",
        question=("What are all the special magic numbers for {key} mentioned in the provided "
                  "text?"),
        cue="The special magic numbers for {key} mentioned in the provided text are",
        blind_cue="The special magic numbers mentioned in the provided text are"),
    "kv": Phrases(
        intro="Extract the value corresponding to the specified key in the table below.",
        fact="{key}: {value}",
        question="What is the value associated with the key {key} in the table?",
        cue="The value associated with the key {key} is",
        blind_cue="The value associated with the asked key is"),
    "vartrack": Phrases(
        intro=("Memorize and track the chain(s) of variable assignment hidden in the following "
               "text."),
        fact="VAR {name} = {value}.",
        link="VAR {name} = VAR {src}.",
        question="Follow the assignments. What number does VAR {name} hold in the end?",
        cue="In the end, VAR {name} holds the number",
        blind_cue="In the end, the asked variable holds the number"),
    "realtext": Phrases(
        intro="Read the following documentation and answer the question after it.",
        fact=("Unless told otherwise, {name}() waits {value} milliseconds before it gives up "
              "on a slow connection."),
        question="How many milliseconds does {name}() wait before it gives up?",
        cue="{name}() waits", blind_cue="It waits"),
}
