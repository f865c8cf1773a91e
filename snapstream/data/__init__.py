"""Long-context retrieval data: RULER-style evaluation sets (passkey, niah, multikey,
multivalue, kv, vartrack, realtext) sized in tokens of the model's tokenizer.

Filler is offline text (standard-library prose, the classic passkey noise). Prompts come raw or
through the model's chat template (``prompt.PROMPT_FORMATS``); ``sample.verdict`` scores a
generation by exact match of the needle values.
"""

from snapstream.data.evalset import build_eval_set
from snapstream.data.filler import CORPORA, Corpus, corpus
from snapstream.data.layout import PromptSpec
from snapstream.data.phrasing import PHRASES, Phrases
from snapstream.data.prompt import PROMPT_FORMATS
from snapstream.data.sample import (
    LENGTH_SLACK,
    Needle,
    Placement,
    Sample,
    TaskConfig,
    exact_match,
    verdict,
)
from snapstream.data.tasks import TASKS, generate

__all__ = [
    "CORPORA",
    "LENGTH_SLACK",
    "PHRASES",
    "PROMPT_FORMATS",
    "TASKS",
    "Corpus",
    "Needle",
    "Phrases",
    "Placement",
    "PromptSpec",
    "Sample",
    "TaskConfig",
    "build_eval_set",
    "corpus",
    "exact_match",
    "generate",
    "verdict",
]
