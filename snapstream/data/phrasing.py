"""Wordings of facts and questions, per task and split. Held-out wordings are never used in
training, so evaluating on them measures retrieval under phrasings the model never saw verbatim.

Templates are ``str.format`` patterns over ``{key}``, ``{value}``, ``{name}`` and ``{src}``.
A sample draws one template of each kind and uses it for all its statements. Training wordings
are frames crossed with synonyms (``{noun}``: "passkey", "access code", ...), a few hundred in
all, so that the model learns to find what a question asks for rather than a handful of
sentences; the held-out wordings use frames and words that no training wording contains.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from snapstream.data.sample import Split


@dataclass(frozen=True)
class Phrases:
    """``facts`` state a value (the answer or a distractor); ``links`` (vartrack) copy one
    variable into another and pair with ``facts`` by index; ``intros`` (kv) open the table."""

    facts: tuple[str, ...]
    questions: tuple[str, ...]
    links: tuple[str, ...] = ()
    intros: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name in ("facts", "questions"):
            if not getattr(self, name):
                raise ValueError(f"{name} must hold at least one template")
        if self.links and len(self.links) != len(self.facts):
            raise ValueError(f"links must pair with facts: {len(self.links)} != {len(self.facts)}")
        if not all(template.isascii() for template in self.templates()):
            raise ValueError("facts, questions, links and intros must be ASCII")

    def templates(self) -> tuple[str, ...]:
        return self.facts + self.questions + self.links + self.intros

def crossed(frames: Iterable[str], nouns: Iterable[str]) -> tuple[str, ...]:
    """Every frame with every noun put in for ``{noun}`` (other placeholders stay)."""
    return tuple(frame.replace("{noun}", noun) for frame in frames for noun in nouns)


PASSKEY_NOUNS = ("passkey", "pass key", "secret passkey", "access code", "secret code",
                 "magic number", "pass code")
MULTIKEY_NOUNS = ("pass key", "special magic number", "number", "code", "secret code",
                  "access code", "magic number")

PHRASES: dict[str, dict[Split, Phrases]] = {
    "passkey": {
        Split.TRAIN: Phrases(
            facts=crossed((
                "The {noun} is {value}.",
                "The {noun} is {value}. Remember it.",
                "Remember this number: the {noun} is {value}.",
                "Here is the {noun}: {value}.",
                "Keep the {noun} {value} in mind.",
                "Note that the {noun} is {value}.",
                "Important: the {noun} is {value}.",
                "The {noun} you will need is {value}.",
                "Your {noun} is {value}. Keep it safe.",
                "Please memorize the {noun}, {value}.",
                "{value} is the {noun}.",
                "The {noun} reads {value}.",
                "The {noun} was set to {value}.",
            ), PASSKEY_NOUNS),
            questions=crossed((
                "What is the {noun}?",
                "What is the {noun} mentioned in the text?",
                "Which number is the {noun}?",
                "Recall the {noun}. What is it?",
                "Can you recall the {noun}?",
                "Please state the {noun}.",
                "What number was given as the {noun}?",
                "Give the {noun}.",
            ), PASSKEY_NOUNS),
        ),
        Split.HELDOUT: Phrases(
            facts=(
                "Do not forget that the passkey equals {value}.",
                "Hidden here is a passkey, and its digits are {value}.",
                "Write this down, the secret number is {value}.",
            ),
            questions=(
                "Tell me the passkey that was hidden in the text.",
                "Which digits make up the secret number?",
            ),
        ),
    },
    "multikey": {
        Split.TRAIN: Phrases(
            facts=(
                "One of the special magic numbers for {key} is: {value}.",
                *crossed((
                    "The {noun} for {key} is {value}.",
                    "The {noun} stored for {key} is {value}.",
                    "Remember that {key} has the {noun} {value}.",
                    "{key} is assigned the {noun} {value}.",
                    "The {noun} of {key} is {value}.",
                    "For {key} the {noun} is {value}.",
                    "Note: {key} uses the {noun} {value}.",
                ), MULTIKEY_NOUNS),
            ),
            questions=crossed((
                "What is the {noun} for {key}?",
                "Which {noun} is stored for {key}?",
                "What {noun} does {key} have?",
                "Recall the {noun} of {key}.",
                "Which {noun} was given for {key}?",
                "What is the {noun} of {key}?",
            ), MULTIKEY_NOUNS),
        ),
        Split.HELDOUT: Phrases(
            facts=(
                "For {key}, the secret code equals {value}.",
                "The code that belongs to {key} reads {value}.",
            ),
            questions=(
                "Tell me the code that belongs to {key}.",
                "For {key}, which secret code was given?",
            ),
        ),
    },
    "kv": {
        Split.TRAIN: Phrases(
            facts=("{key}: {value}", "{key} = {value}", "{key} | {value}", "{key}, {value}"),
            questions=(
                "What is the value for key {key}?",
                "Find {key} in the list. What value does it have?",
                "Which value is paired with {key}?",
                "What value goes with {key}?",
                "Give the value stored under {key}.",
                "The key {key} has which value?",
                "Return the value of {key}.",
            ),
            intros=(
                "Here is a list of keys and values:",
                "Key-value pairs follow, one per line:",
                "Below are keys with their values:",
                "Each line holds a key and its value:",
                "A small dictionary of entries:",
            ),
        ),
        Split.HELDOUT: Phrases(
            facts=("{key} -> {value}",),
            questions=("Look up {key} and give its value.", "{key} maps to which value?"),
            intros=("Each key below maps to a value:",),
        ),
    },
    "vartrack": {
        Split.TRAIN: Phrases(
            facts=(
                "VAR {name} = {value}.",
                "Set {name} to {value}.",
                "{name} := {value}.",
                "Assign {value} to {name}.",
                "{name} gets {value}.",
                "{name} is {value}.",
                "Store {value} in {name}.",
            ),
            links=(
                "VAR {name} = VAR {src}.",
                "Set {name} to {src}.",
                "{name} := {src}.",
                "Assign {src} to {name}.",
                "{name} gets {src}.",
                "{name} is {src}.",
                "Copy {src} into {name}.",
            ),
            questions=(
                "What is the value of {name}?",
                "Follow the assignments. Which number does {name} hold?",
                "Which number ends up in {name}?",
                "What does {name} contain?",
                "Resolve {name}. What number is it?",
            ),
        ),
        Split.HELDOUT: Phrases(
            facts=("Let {name} be {value}.",),
            links=("Let {name} be {src}.",),
            questions=(
                "After all the assignments, what number is in {name}?",
                "Trace {name} back to its number.",
            ),
        ),
    },
}
