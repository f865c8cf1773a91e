"""Wordings of facts and questions, per task and split. Held-out wordings are never used in
training, so evaluating on them measures retrieval under phrasings the model never saw verbatim.

Templates are ``str.format`` patterns over ``{key}``, ``{value}``, ``{name}`` and ``{src}``.
A sample draws one template of each kind and uses it for all its statements.
"""

from __future__ import annotations

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


PHRASES: dict[str, dict[Split, Phrases]] = {
    "passkey": {
        Split.TRAIN: Phrases(
            facts=(
                "The passkey is {value}.",
                "The pass key is {value}. Remember it.",
                "Remember this number: the passkey is {value}.",
                "Here is the secret passkey: {value}.",
                "Keep the passkey {value} in mind.",
            ),
            questions=(
                "What is the passkey?",
                "What is the pass key mentioned in the text?",
                "Which number is the passkey?",
                "Recall the secret passkey. What is it?",
            ),
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
                "The pass key for {key} is {value}.",
                "One of the special magic numbers for {key} is: {value}.",
                "The number stored for {key} is {value}.",
                "Remember that {key} has the code {value}.",
            ),
            questions=(
                "What is the pass key for {key}?",
                "What is the special magic number for {key}?",
                "Which number is stored for {key}?",
            ),
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
            facts=("{key}: {value}", "{key} = {value}"),
            questions=(
                "What is the value for key {key}?",
                "Find {key} in the list. What value does it have?",
                "Which value is paired with {key}?",
            ),
            intros=("Here is a list of keys and values:", "Key-value pairs follow, one per line:"),
        ),
        Split.HELDOUT: Phrases(
            facts=("{key} -> {value}",),
            questions=("Look up {key} and give its value.", "{key} maps to which value?"),
            intros=("Each key below maps to a value:",),
        ),
    },
    "vartrack": {
        Split.TRAIN: Phrases(
            facts=("VAR {name} = {value}.", "Set {name} to {value}."),
            links=("VAR {name} = VAR {src}.", "Set {name} to {src}."),
            questions=(
                "What is the value of {name}?",
                "Follow the assignments. Which number does {name} hold?",
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
