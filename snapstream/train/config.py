"""Training configuration: model shape, optimisation, and the context-length curriculum."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

from snapstream.config import ModelConfig
from snapstream.data import TrainingMixture
from snapstream.tokenizer import ByteTokenizer

TOKENIZER = ByteTokenizer(vocab_size=264)  # 256 bytes + bos/eos/pad, padded to a multiple of 8
PAD_ID = 258
LENGTH_JITTER = 16  # a batch of length L holds prompts of L - LENGTH_JITTER .. L bytes


@dataclass(frozen=True)
class Phase:
    """A curriculum phase: from ``start_fraction`` of training on, prompts of min_len..max_len
    with up to ``max_distractors`` distractors and ``max_hops`` variable-tracking hops, drawn
    from ``tasks`` (empty: every task of ``TrainConfig.task_weights``). Short, easy samples
    first: retrieval is learnt at short range long before it is at 2k."""

    start_fraction: float
    min_len: int
    max_len: int
    batch_size: int
    max_distractors: int = 3
    max_hops: int = 3
    tasks: tuple[str, ...] = ()

    def mixture(self, task_weights: Mapping[str, float], seed: int, length: int
                ) -> TrainingMixture:
        """The samples of one batch of this phase whose longest prompt is ``length`` bytes."""
        weights = {task: weight for task, weight in task_weights.items()
                   if not self.tasks or task in self.tasks}
        return TrainingMixture(seed=seed, weights=weights,
                               context_len_range=(length - LENGTH_JITTER, length),
                               max_distractors=self.max_distractors, max_hops=self.max_hops)


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 2900
    lr: float = 2e-3
    min_lr_fraction: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.05
    grad_clip: float = 1.0
    # loss weight of the prompt bytes relative to the answer bytes. Language modelling the filler
    # is what makes retrieval learnable: at 0.05 answer accuracy stayed at chance for 700 steps,
    # at 1.0 (all else equal) it left chance after ~330 steps (docs/accuracy.md, "Training").
    lm_weight: float = 1.0
    # passkey alone first: copying the one number in the context is the skill every task
    # builds on, and it is learnt fastest where nothing else competes (docs/accuracy.md); with
    # hundreds of wordings it forms later (accuracy 0.3 at step 680, not 0.49 at 610 as with
    # five), so the phase runs ~960 steps
    # then a long phase of every task at short range, where a step is cheap: the harder tasks
    # fail even at 300 bytes when this phase is short (docs/accuracy.md)
    phases: tuple[Phase, ...] = (
        Phase(0.0, 200, 256, 32, max_distractors=0, max_hops=1, tasks=("passkey",)),
        Phase(0.33, 336, 512, 20, max_distractors=2, max_hops=1),
        Phase(0.58, 448, 896, 12, max_distractors=3, max_hops=2),
        Phase(0.72, 896, 1500, 8),
        Phase(0.86, 1500, 2040, 6),
    )
    hidden_size: int = 128
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 384
    context_len: int = 2048
    checkpoint_every: int = 200
    log_every: int = 10
    time_limit_min: float = 58.0
    task_weights: dict[str, float] = field(
        default_factory=lambda: {"passkey": 1.0, "multikey": 1.5, "kv": 1.5, "vartrack": 1.5})
    # the CachePolicy fields the checkpoint is served with (snapstream_policy.json): a needle
    # of bytes spans ~15 tokens, and SnapKV's pooling kernel must cover it (docs/accuracy.md)
    serving_policy: dict[str, int] = field(default_factory=lambda: {"kernel": 15})

    def __post_init__(self) -> None:
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")
        if not self.phases or self.phases[0].start_fraction != 0.0:
            raise ValueError("phases must start with a phase at start_fraction 0.0")
        unknown = {t for p in self.phases for t in p.tasks} - set(self.task_weights)
        if unknown:
            raise ValueError(f"phases name tasks without a weight in task_weights: {unknown}")
        for i, phase in enumerate(self.phases):  # fail now, not at the phase's first batch
            try:
                phase.mixture(self.task_weights, seed=0, length=phase.min_len)
            except ValueError as err:
                raise ValueError(f"phases[{i}] (min_len {phase.min_len}; a batch holds prompts "
                                 f"from min_len - {LENGTH_JITTER} bytes): {err}") from None
        if max(p.max_len for p in self.phases) + 8 > self.context_len:
            raise ValueError("phases: max_len + answer must fit in context_len")
        if self.num_kv_heads >= self.num_heads:
            raise ValueError("num_kv_heads must be < num_heads (grouped-query attention)")

    def phase_at(self, step: int) -> Phase:
        fraction = step / self.steps
        return [p for p in self.phases if p.start_fraction <= fraction][-1]

    def model_config(self) -> ModelConfig:
        return ModelConfig(
            vocab_size=TOKENIZER.vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_layers=self.num_layers,
            num_heads=self.num_heads, num_kv_heads=self.num_kv_heads,
            head_dim=self.hidden_size // self.num_heads,
            max_position_embeddings=self.context_len, tie_word_embeddings=True,
            bos_token_id=TOKENIZER.bos_token_id, eos_token_ids=TOKENIZER.eos_token_ids,
        )

    def to_dict(self) -> dict:
        return asdict(self)
