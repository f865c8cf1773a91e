"""Long-context retrieval data: RULER-style evaluation sets (passkey, niah, multikey,
multivalue, kv, vartrack, realtext) and workloads on real text (codesearch, paraphrase,
multineedle; the multiquestion document in :mod:`evaldata.document`), sized in tokens of the
model's tokenizer.

Filler is offline text (standard-library prose, the classic passkey noise). Prompts come raw or
through the model's chat template (``prompt.PROMPT_FORMATS``; ``model_format`` picks a model's
own); each sample names its scorer (:data:`SCORERS`: exact values, all values, a function's
name).
"""

from evaldata.evalset import build_eval_set
from evaldata.filler import CORPORA, Corpus, corpus
from evaldata.layout import PromptSpec
from evaldata.phrasing import PHRASES, Phrases
from evaldata.prompt import PROMPT_FORMATS, model_format
from evaldata.sample import LENGTH_SLACK, Needle, Placement, Sample, TaskConfig
from evaldata.scoring import SCORERS, exact_match, score, verdict
from evaldata.tasks import TASKS, generate

__all__ = [
    "CORPORA",
    "LENGTH_SLACK",
    "PHRASES",
    "PROMPT_FORMATS",
    "SCORERS",
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
    "model_format",
    "score",
    "verdict",
]
