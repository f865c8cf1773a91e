"""Does a checkpoint copy by induction? Accuracy on the bytes (after the first 4) of a 30-byte
random string seen once before, 300 bytes of held-out filler earlier; and, for contrast, on a
repeated span of the filler itself (which language modelling alone predicts in part).

  python docs/probes/diag_induction.py MODEL_DIR
"""

import random
import sys

import torch

from snapstream.data.filler import filler_corpus
from snapstream.loader import load_model
from snapstream.model import causal_attend

torch.set_num_threads(1)
torch.set_grad_enabled(False)
model = load_model(sys.argv[1])
ALPHABETS = {"upper+digits": "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789",
             "lowercase": "abcdefghijklmnopqrstuvwxyz"}


def predictions(ids: list[int]) -> list[int]:
    x = torch.tensor(ids[:-1])[None]  # (1, T)
    hidden = model(x, torch.arange(x.shape[1])[None], causal_attend)  # (1, T, hidden)
    return model.logits(hidden)[0].argmax(-1).tolist()


for kind in (*ALPHABETS, "filler span"):
    hits = total = 0
    for i in range(30):
        rng = random.Random(f"d/{i}")
        text = filler_corpus("heldout").window(rng, 300).text
        if kind in ALPHABETS:
            span = "".join(rng.choice(ALPHABETS[kind]) for _ in range(30))
            sequence = f"{span} {text} {span}"
        else:
            start = rng.randrange(0, len(text) - 40)
            span = text[start : start + 30]
            sequence = f"{text} {span}"
        ids = [256, *sequence.encode()]
        pred = predictions(ids)
        first = len(ids) - 30 + 4
        hits += sum(pred[j - 1] == ids[j] for j in range(first, len(ids)))
        total += len(ids) - first
    print(f"{kind}: {hits / total:.3f}")
