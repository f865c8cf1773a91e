"""Wordings of each task: the classic passkey test's, RULER's (Hsieh et al., 2024) for the
needle tasks, a documentation sentence for the real-text task, and the wordings of the
workloads on real text (code search, paraphrased needle, multi-needle, multi-question).

Templates are ``str.format`` patterns over ``{key}``, ``{value}``, ``{name}``, ``{src}``,
``{keys}``, ``{path}`` and ``{description}``. ``KEYED_FACTS``: the multi-needle and
multi-question facts, one wording per needle of a prompt, so that its needles differ in form.
``cue`` starts the answer when the question comes after the context; ``blind_cue`` does so when
it comes before, and names no key, so the end of the prompt (SnapKV's observation window) does
not tell which needle is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass

from evaldata.sample import Placement


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

    def cue_for(self, placement: Placement, **names: str) -> str:
        """The answer cue for a question ``placement``d after or before the context."""
        return (self.cue if placement is Placement.AFTER else self.blind_cue).format(**names)


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

KEYED_FACTS = (
    "One of the special magic numbers for {key} is: {value}.",
    "The access code for the {key} vault is {value}.",
    "Parcel {key} was shipped under tracking number {value}.",
    "The {key} team finished the season with {value} points.",
    "The {key} account was opened with a deposit of {value} coins.",
)

PHRASES |= {
    "codesearch": Phrases(
        intro=("Below are Python source files, each after a line '# file: <path>'. Read them "
               "and answer the question about them."),
        fact="# file: {path}",
        question=("Which function in these files does the following? {description} Answer "
                  "with the function's name only."),
        cue="The function is", blind_cue="The function is"),
    "paraphrase": Phrases(
        intro=("A single fact is planted somewhere in the following text. Read it and answer "
               "the question about it."),
        fact="{value}",  # the fact and question come from evaldata.paraphrases
        question="{question}",
        cue="The answer is", blind_cue="The answer is"),
    "multineedle": Phrases(
        intro=("Some numbers are hidden within the following text, each given for a name. Make "
               "sure to memorize them. I will quiz you about the numbers afterwards."),
        fact=KEYED_FACTS[0],
        question="What numbers does the text give for {keys}?",
        cue="The numbers for {keys} are", blind_cue="The numbers asked for are"),
    "multiquestion": Phrases(
        intro=("Some numbers are hidden within the following text, each given for a name. Make "
               "sure to memorize them. I will quiz you about the numbers afterwards."),
        fact=KEYED_FACTS[0],
        question="What number does the text give for {key}?",
        cue="The number for {key} is", blind_cue="The number asked for is"),
}
