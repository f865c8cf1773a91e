"""Synthetic long-context retrieval data: RULER-style evaluation sets (passkey, multikey, kv,
vartrack).

Pure standard library. Filler is prose from this interpreter's standard library; facts and
questions come in train and held-out wordings (``Split``), so evaluation can use filler and
phrasings the model never saw. The prompt format and length rule are described in
``snapstream.data.sample``.
"""

from snapstream.data.evalset import build_eval_set
from snapstream.data.filler import FillerCorpus, filler_corpus
from snapstream.data.phrasing import PHRASES, Phrases
from snapstream.data.sample import (
    ANSWER_CUE,
    LENGTH_SLACK,
    MAX_ANSWER_LEN,
    TERMINATOR,
    Needle,
    Placement,
    Sample,
    Split,
    TaskConfig,
    exact_match,
)
from snapstream.data.tasks import TASKS, generate

__all__ = [
    "ANSWER_CUE",
    "LENGTH_SLACK",
    "MAX_ANSWER_LEN",
    "PHRASES",
    "TASKS",
    "TERMINATOR",
    "FillerCorpus",
    "Needle",
    "Phrases",
    "Placement",
    "Sample",
    "Split",
    "TaskConfig",
    "build_eval_set",
    "exact_match",
    "filler_corpus",
    "generate",
]
