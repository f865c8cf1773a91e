"""Model shapes the cost model needs, with parameter, KV-cache and FLOP counts per layer.

Counts are per token unless a name says otherwise. Attention and feed-forward kinds share a
small interface (``params``, ``decode_flops`` ...), so the cost model never branches on kind.
"""

from __future__ import annotations

from dataclasses import dataclass


def _require_positive(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{type(owner).__name__}.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class GqaAttention:
    """Grouped-query attention (Llama family): K and V cached per KV head."""

    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _require_positive(self, "hidden_size", "n_heads", "n_kv_heads", "head_dim")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})"
            )

    @property
    def kv_heads(self) -> int:
        return self.n_kv_heads

    def params(self) -> int:
        q_width, kv_width = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        return self.hidden_size * (2 * q_width + 2 * kv_width)  # q, k, v, o projections

    def replicated_params(self) -> int:
        return 0  # every projection splits by head

    def kv_elements(self) -> int:
        return 2 * self.n_kv_heads * self.head_dim  # K and V

    def decode_flops(self, cache_tokens: int) -> int:
        """Attention FLOPs of one query token against ``cache_tokens`` keys: QK^T and PV."""
        return 4 * self.n_heads * self.head_dim * cache_tokens

    def pair_flops(self) -> int:
        """FLOPs per (query, key) pair in prefill."""
        return 4 * self.n_heads * self.head_dim

    def width(self) -> int:
        """Widest per-token activation of the block (q, k and v concatenated)."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim


@dataclass(frozen=True)
class MlaAttention:
    """Multi-head latent attention (DeepSeek-V2/V3): one latent vector plus a RoPE key cached.

    Decode uses the absorbed form (keys and values stay in the latent space), so each cached
    token costs ``kv_lora_rank + qk_rope_head_dim`` elements and every head attends over it.
    """

    hidden_size: int
    n_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    def __post_init__(self) -> None:
        _require_positive(
            self, "hidden_size", "n_heads", "kv_lora_rank", "qk_nope_head_dim",
            "qk_rope_head_dim", "v_head_dim",
        )
        if self.q_lora_rank is not None:
            _require_positive(self, "q_lora_rank")

    @property
    def kv_heads(self) -> int:
        return 1  # the latent is shared by all heads, like multi-query attention

    def params(self) -> int:
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        if self.q_lora_rank is None:
            q = self.hidden_size * self.n_heads * qk_dim
        else:  # q_a_proj, q_a_layernorm, q_b_proj
            q = self.q_lora_rank * (self.hidden_size + 1 + self.n_heads * qk_dim)
        kv_a = self.hidden_size * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv_b = self.kv_lora_rank * self.n_heads * (self.qk_nope_head_dim + self.v_head_dim)
        o = self.n_heads * self.v_head_dim * self.hidden_size
        return q + kv_a + kv_b + o

    def replicated_params(self) -> int:
        """The down-projections (q_a with its norm, kv_a with its norm): their outputs are
        normalised whole before any head reads them, so every socket keeps them whole, as
        DeepSeek-V3's reference inference code does (plain ``Linear``, not column-parallel)."""
        q_a = 0 if self.q_lora_rank is None else self.q_lora_rank * (self.hidden_size + 1)
        kv_a = self.hidden_size * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        return q_a + kv_a

    def kv_elements(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim

    def decode_flops(self, cache_tokens: int) -> int:
        scores = 2 * self.n_heads * (self.kv_lora_rank + self.qk_rope_head_dim)
        values = 2 * self.n_heads * self.kv_lora_rank
        return (scores + values) * cache_tokens

    def pair_flops(self) -> int:
        """Prefill runs the non-absorbed form: per-head keys of nope+rope dims, values of v."""
        qk_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
        return 2 * self.n_heads * (qk_dim + self.v_head_dim)

    def width(self) -> int:
        return self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)


Attention = GqaAttention | MlaAttention


@dataclass(frozen=True)
class DenseFfn:
    """SwiGLU feed-forward: gate, up and down projections."""

    hidden_size: int
    intermediate_size: int

    def __post_init__(self) -> None:
        _require_positive(self, "hidden_size", "intermediate_size")

    def params(self) -> int:
        return 3 * self.hidden_size * self.intermediate_size

    def routed_params(self) -> int:
        return 0

    def replicated_params(self) -> int:
        return 0

    def touched_experts(self, tokens: int) -> float:
        return 0.0  # no routing

    def routed_read_params(self, tokens: int) -> float:
        return 0.0

    def flops_per_token(self) -> int:
        return 2 * self.params()

    def width(self) -> int:
        return 2 * self.intermediate_size


@dataclass(frozen=True)
class MoeFfn:
    """Mixture of SwiGLU experts: ``n_shared`` always-on experts and ``top_k`` of ``n_routed``.

    Expected routed experts touched by ``tokens`` tokens assumes independent uniform routing:
    ``n_routed * (1 - (1 - top_k / n_routed) ** tokens)``; real routing is skewed, so this is an
    upper bound on the weight bytes read.
    """

    hidden_size: int
    expert_intermediate_size: int
    n_routed: int
    n_shared: int
    top_k: int

    def __post_init__(self) -> None:
        _require_positive(self, "hidden_size", "expert_intermediate_size", "n_routed", "top_k")
        if self.n_shared < 0:
            raise ValueError(f"MoeFfn.n_shared must be >= 0, got {self.n_shared}")
        if self.top_k > self.n_routed:
            raise ValueError(f"top_k ({self.top_k}) must be <= n_routed ({self.n_routed})")

    def expert_params(self) -> int:
        return 3 * self.hidden_size * self.expert_intermediate_size

    def params(self) -> int:
        router = self.n_routed * self.hidden_size
        return (self.n_routed + self.n_shared) * self.expert_params() + router

    def routed_params(self) -> int:
        return self.n_routed * self.expert_params()

    def replicated_params(self) -> int:
        """The router: every socket scores all ``n_routed`` experts for its tokens."""
        return self.n_routed * self.hidden_size

    def touched_experts(self, tokens: int) -> float:
        miss = (1 - self.top_k / self.n_routed) ** tokens
        return self.n_routed * (1 - miss)

    def routed_read_params(self, tokens: int) -> float:
        """Routed-expert parameters one forward pass over ``tokens`` tokens reads."""
        return self.touched_experts(tokens) * self.expert_params()

    def flops_per_token(self) -> int:
        router = self.n_routed * self.hidden_size
        return 2 * ((self.top_k + self.n_shared) * self.expert_params() + router)

    def width(self) -> int:
        return 2 * self.expert_intermediate_size * (self.top_k + self.n_shared)


Ffn = DenseFfn | MoeFfn


@dataclass(frozen=True)
class LayerGroup:
    """Consecutive decoder layers of one shape: one kernel, looped with kernel looping.
    ``window``: the sliding window of their attention (Gemma 3's local layers), whose exact
    cache is that many tokens at most; None: global attention over the whole context."""

    count: int
    ffn: Ffn
    window: int | None = None

    def __post_init__(self) -> None:
        _require_positive(self, "count")
        if self.window is not None:
            _require_positive(self, "window")

    def held_tokens(self, cache_tokens: int) -> int:
        """Tokens each of these layers caches (and a decode step reads) when a global layer
        holds ``cache_tokens``."""
        return cache_tokens if self.window is None else min(cache_tokens, self.window)

    def prefill_pairs(self, prompt_len: int) -> int:
        """(query, key) pairs one layer attends over in a causal prefill of ``prompt_len``."""
        if self.window is None or prompt_len <= self.window:
            return prompt_len * (prompt_len + 1) // 2
        inside = self.window * (self.window + 1) // 2  # the first window: causal
        return inside + (prompt_len - self.window) * self.window


@dataclass(frozen=True)
class ModelSpec:
    name: str
    hidden_size: int
    vocab_size: int
    tie_embeddings: bool
    attention: Attention
    layer_groups: tuple[LayerGroup, ...]

    def __post_init__(self) -> None:
        _require_positive(self, "hidden_size", "vocab_size")
        if not self.layer_groups:
            raise ValueError("ModelSpec.layer_groups must not be empty")

    @property
    def n_layers(self) -> int:
        return sum(group.count for group in self.layer_groups)

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def head_params(self) -> int:
        """LM head parameters not shared with the embedding, plus the final norm."""
        return self.hidden_size + (0 if self.tie_embeddings else self.embedding_params())

    def layer_params(self, group: LayerGroup) -> int:
        norms = 2 * self.hidden_size
        return self.attention.params() + group.ffn.params() + norms

    def replicated_layer_params(self, group: LayerGroup) -> int:
        """Parameters of one layer that tensor parallelism keeps whole on every socket: the
        two norms and the attention's and FFN's replicated matrices."""
        norms = 2 * self.hidden_size
        return self.attention.replicated_params() + group.ffn.replicated_params() + norms

    def params(self) -> int:
        layers = sum(g.count * self.layer_params(g) for g in self.layer_groups)
        return self.embedding_params() + layers + self.head_params()

    def kv_elements_per_token(self) -> int:
        """KV-cache elements one token occupies across all layers."""
        return self.n_layers * self.attention.kv_elements()

    def kv_elements(self, cache_tokens: int) -> int:
        """KV-cache elements of one sequence whose global layers hold ``cache_tokens`` tokens
        (sliding-window layers hold at most their window)."""
        return sum(g.count * g.held_tokens(cache_tokens) for g in self.layer_groups
                   ) * self.attention.kv_elements()

    def decode_attention_flops(self, cache_tokens: int) -> int:
        """QK^T and PV FLOPs of one decode token over every layer."""
        return sum(g.count * self.attention.decode_flops(g.held_tokens(cache_tokens))
                   for g in self.layer_groups)

    def prefill_pairs(self, prompt_len: int) -> int:
        """(query, key) pairs of one prompt's causal prefill over every layer."""
        return sum(g.count * g.prefill_pairs(prompt_len) for g in self.layer_groups)
