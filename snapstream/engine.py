"""In-process engine: prefill (+ SnapKV) -> SequenceCache -> batched static decode.

The services call the same three steps: :meth:`Engine.prefill`, :meth:`Engine.new_decoder` with
:meth:`Decoder.step`, and :func:`snapstream.sampling.sample_batch`.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from itertools import pairwise
from pathlib import Path

import torch

from snapstream.attention import PrefillRecorder
from snapstream.cancel import Cancel, checking
from snapstream.checkpoints import open_checkpoint
from snapstream.decode import Decoder
from snapstream.fingerprint import model_fingerprint
from snapstream.finish import STOP_TOKEN, finish_reason
from snapstream.kvcache import BatchCache, ModelLayout, SequenceCache
from snapstream.kvquant import kv_codec
from snapstream.loader import load_model
from snapstream.memory import keep_freed_memory
from snapstream.model import Transformer
from snapstream.placement import at_original_positions
from snapstream.policy import CacheLayout, CachePolicy, load_default_policy
from snapstream.prefix_cache import (
    OPENING_TOKENS,
    check_policy,
    compress_document,
    prefill_on_prefix,
)
from snapstream.prefix_config import DEFAULT_DOCUMENT_CACHE, DocumentCacheConfig
from snapstream.prefix_scores import REPEAT_INSTRUCTION
from snapstream.probe import probe_ids
from snapstream.quant import GEMM_MIN_ROWS, QUANT_SCHEMES, quantize_model, use_int4_x_bits
from snapstream.sampling import sample_batch
from snapstream.sampling_params import SamplingParams
from snapstream.tokenizer import Tokenizer
from snapstream.units import unit_spans
from snapstream.weight_formats import AUTO, WeightFormat, kv_dtype_name, weight_format

# a prompt this long runs every quantized layer's GEMM path (quant.GEMM_MIN_ROWS rows)
WARM_UP_TOKENS = 2 * GEMM_MIN_ROWS


@dataclass(frozen=True)
class PrefillResult:
    cache: SequenceCache
    logits: torch.Tensor  # (V,) float32, next-token logits after the last prompt token
    prefill_s: float
    select_s: float  # share of prefill spent scoring + compressing


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    text: str
    finish_reason: str  # "stop_token" | "length" (the names of the proto and the SDK)
    prompt_tokens: int
    ttft_s: float  # prefill and the first token's sampling
    decode_s: float  # the tokens after the first


class Engine:
    def __init__(self, model: Transformer, tokenizer: Tokenizer, compile: bool = False,
                 default_policy: CachePolicy | None = None, name: str = "model",
                 kv_dtype: torch.dtype | None = None,
                 prefill_dtype: torch.dtype | None = None) -> None:
        self.model, self.tokenizer, self.compile = model, tokenizer, compile
        self.default_policy = default_policy or CachePolicy()  # for requests that name none
        self.name = name
        self.config = model.config
        self.device = model.lm_head.weight.device
        self.dtype = model.model.norm.weight.dtype  # activations (weights may be int8/int4)
        # sequence caches, blobs and decode pools: a KV dtype of snapstream.kvquant
        self.kv_dtype = kv_dtype or self.dtype
        kv_codec(self.kv_dtype).row_width(self.config.head_dim)  # refuses what cannot be held
        self.prefill_dtype = prefill_dtype or self.dtype  # activations of the prompt forward
        if self.prefill_dtype != self.dtype and any(
                isinstance(m, torch.nn.Linear) for m in model.model.layers.modules()):
            raise ValueError(f"prefill_dtype {self.prefill_dtype} needs quantized linear layers "
                             f"(dtype int8, int4 or gguf); this model's are {self.dtype}: leave "
                             "prefill_dtype unset")

    @classmethod
    def from_pretrained(
        cls, path: str | Path | None = None, dtype: str | torch.dtype = AUTO,
        device: str = "cpu", compile: bool = False, kv_dtype: str | None = None,
    ) -> Engine:
        """``path``: a .gguf file or a Hugging Face checkpoint directory; None: the default
        model (SmolLM2-135M-Instruct). ``dtype``: a name of ``weight_formats.DTYPE_CHOICES``
        ("gguf": a GGUF's quantized blocks as they are, "int8", "int4": requantized weights;
        all three with float32 activations in decode, the CPU's GEMM dtype in the prompt
        forward (bfloat16 where it has bfloat16 instructions, else float32), and an
        int8 KV cache; "auto": the checkpoint's own format on the CPU, float32 elsewhere)
        or a torch float dtype. ``kv_dtype``: a name of ``weight_formats.KV_DTYPES`` ("int8":
        int8 codes with a float32 scale per slot and head), None: the format's own."""
        checkpoint = open_checkpoint(path)
        native = checkpoint.native_format if torch.device(device).type == "cpu" else "float32"
        fmt = weight_format(dtype, native) if isinstance(dtype, str) else WeightFormat(
            str(dtype).removeprefix("torch."))
        kv = kv_dtype_name(kv_dtype, fmt)
        model = load_model(checkpoint, dtype=getattr(torch, fmt.compute), device=device,
                           keep_blocks=fmt.keep_blocks)
        if fmt.quant is not None:
            quantize_model(model, QUANT_SCHEMES[fmt.quant])
        if checkpoint.int4_x_bits is not None:
            use_int4_x_bits(model, checkpoint.int4_x_bits)
        return cls(model, checkpoint.tokenizer(), compile,
                   load_default_policy(checkpoint.policy_file), name=checkpoint.name,
                   kv_dtype=getattr(torch, kv),
                   prefill_dtype=getattr(torch, fmt.prefill_dtype))

    @cached_property
    def fingerprint(self) -> bytes:
        """Identity of the model's architecture and weights (checked in every KV blob)."""
        return model_fingerprint(self.model)

    @property
    def context_len(self) -> int:
        return self.config.max_position_embeddings

    def encode(self, prompt: str | list[int]) -> list[int]:
        ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self.check_prompt(ids)
        return ids

    def check_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("prompt is empty: give some text or token ids")
        if len(ids) > self.context_len:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's context is "
                             f"{self.context_len}: shorten it")
        bad = [i for i in ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"token ids {bad[:5]} are outside the vocabulary [0, "
                             f"{self.config.vocab_size})")

    def prefill(self, ids: list[int], policy: CachePolicy, max_new_tokens: int,
                capacity: int | None = None, positions: Sequence[int] | None = None,
                cancel: Cancel | None = None) -> PrefillResult:
        """Full attention over the prompt, then the policy's compression into its layout
        (growing policies sized to ``capacity`` when given, see CachePolicy.layout). Checks
        ``ids`` and ``policy`` against the model (ValueError naming what to change).
        ``positions``: the ids' own positions when they are the kept part of a longer prompt
        (ascending; speculative prefill's original positions), None for 0..len-1. ``cancel``:
        checked before each layer (:class:`~snapstream.cancel.Cancelled` once set)."""
        self.check_prompt(ids)
        return self._prefill(ids, policy, max_new_tokens, capacity, positions, cancel)

    def warm_up_prefill(self) -> float:
        """Pays at start-up what the first prompt of a prefill worker would pay otherwise: the
        cached GEMM weights of the quantized layers (made on a layer's first input of
        ``GEMM_MIN_ROWS`` rows or more; 197 MiB for SmolLM2 in bfloat16, 394 MiB in float32 on
        CPUs without bfloat16 instructions) and the kernels' first use. A
        prompt of ``WARM_UP_TOKENS`` tokens (the context's, if shorter), after setting the
        process's malloc to keep freed memory (:func:`snapstream.memory.keep_freed_memory`);
        returns its seconds."""
        keep_freed_memory()
        ids = [i % self.config.vocab_size for i in range(min(WARM_UP_TOKENS, self.context_len))]
        start = time.perf_counter()
        self._prefill(ids, CachePolicy(kind="full"), 1)
        return time.perf_counter() - start

    def check_positions(self, ids: list[int], positions: Sequence[int]) -> None:
        if len(positions) != len(ids) or any(b <= a for a, b in pairwise(positions)):
            raise ValueError("positions: give one ascending position per prompt token")
        if positions[0] < 0 or positions[-1] >= self.context_len:
            raise ValueError(f"positions must lie in [0, {self.context_len}) (the model's "
                             f"context), got {positions[0]}..{positions[-1]}")

    @torch.no_grad()
    def _prefill(self, ids: list[int], policy: CachePolicy, max_new_tokens: int,
                 capacity: int | None = None, positions: Sequence[int] | None = None,
                 cancel: Cancel | None = None) -> PrefillResult:
        """:meth:`prefill` of ids already checked by :meth:`check_prompt`."""
        if positions is not None:
            self.check_positions(ids, positions)
        policy.check_context(self.context_len)
        layout = policy.layout(len(ids), max_new_tokens, capacity)
        selects = layout.compresses(len(ids)) and layout.n_topk > 0
        probe = probe_ids(self.tokenizer, ids, policy.observe) if selects else []
        spans = unit_spans(self.tokenizer, ids, policy.unit) if selects else None
        at = (torch.arange(len(ids)) if positions is None else torch.tensor(positions)
              ).to(self.device)  # (P,)
        run_at = torch.cat((at, at[-1] + 1 + torch.arange(len(probe), device=self.device))
                           )  # (P + A,): the probe's A after the prompt
        recorder = PrefillRecorder(self.model_layout(layout), self.kv_dtype,
                                   observation=policy.observation + len(probe) if selects else 0,
                                   kernel=policy.kernel, pooling=policy.pooling,
                                   positions=None if positions is None else run_at,
                                   outputs=1 + len(probe), probe=len(probe), spans=spans)
        start = time.perf_counter()
        input_ids = torch.tensor([ids + probe], device=self.device)  # (1, P + A)
        hidden = self.model(input_ids, run_at[None], checking(recorder, cancel),
                            self.prefill_dtype)  # (1, 1 + A, hidden)
        logits = self.model.logits(hidden[0, 0].to(self.dtype))  # (V,): the prompt's last
        cache = recorder.cache(len(ids))
        if positions is not None:
            cache = at_original_positions(cache, at)
        return PrefillResult(cache=cache, logits=logits, prefill_s=time.perf_counter() - start,
                             select_s=recorder.select_s)

    def model_layout(self, layout: CacheLayout) -> ModelLayout:
        """The layer groups of this model for a policy's ``layout``: its global layers in it,
        each sliding-window layer in a ring of its window."""
        return ModelLayout.build(self.config.attention_windows, layout)

    def compress_prefix(self, doc_ids: list[int], policy: CachePolicy, max_new_tokens: int,
                        capacity: int | None = None,
                        doc_config: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE,
                        cancel: Cancel | None = None) -> SequenceCache:
        """A reusable document's question-agnostic cache for requests of ``policy``, scored and
        sized by ``doc_config`` (:mod:`snapstream.prefix_cache`); ValueError for a policy or
        model it cannot serve."""
        self.check_prompt(doc_ids)
        policy.check_context(self.context_len)
        check_policy(policy)
        layout = policy.layout(len(doc_ids), max_new_tokens, capacity)
        instruction = self.tokenizer.encode(REPEAT_INSTRUCTION)
        pieces = [self.tokenizer.decode([token]) for token in doc_ids]
        return compress_document(self.model, doc_ids, pieces, instruction, layout, doc_config,
                                 self.kv_dtype, self.prefill_dtype, cancel)

    def prefill_on_prefix(self, prefix: SequenceCache, ids: list[int], policy: CachePolicy,
                          max_new_tokens: int, capacity: int | None = None,
                          doc_config: DocumentCacheConfig = DEFAULT_DOCUMENT_CACHE
                          ) -> PrefillResult:
        """:meth:`prefill` of ``ids`` whose first ``prefix.prompt_len`` tokens are the document
        of ``prefix`` (:meth:`compress_prefix` under ``doc_config``): only the rest runs
        through the model."""
        self.check_prompt(ids)
        check_policy(policy)
        layout = policy.layout(len(ids), max_new_tokens, capacity)
        start = time.perf_counter()
        opening = self.tokenizer.turn_opening(ids[: prefix.prompt_len], OPENING_TOKENS)
        cache, hidden = prefill_on_prefix(self.model, prefix, ids[prefix.prompt_len:], opening,
                                          policy, layout, doc_config, self.kv_dtype,
                                          self.prefill_dtype,
                                          probe_ids(self.tokenizer, ids, policy.observe),
                                          unit_spans(self.tokenizer, ids, policy.unit)
                                          if layout.compresses(len(ids)) and layout.n_topk > 0
                                          else None)
        logits = self.model.logits(hidden.to(self.dtype))  # (V,)
        return PrefillResult(cache=cache, logits=logits, prefill_s=time.perf_counter() - start,
                             select_s=0.0)

    def new_decoder(self, layout: ModelLayout, batch_size: int) -> Decoder:
        cache = BatchCache(self.config, layout, batch_size, self.kv_dtype, self.device)
        return Decoder(self.model, cache, compile=self.compile)

    def stop_ids(self, sampling: SamplingParams) -> set[int]:
        eos = () if sampling.ignore_eos else self.tokenizer.eos_token_ids
        return set(sampling.stop_token_ids) | set(eos)

    def generate(
        self, prompt: str | list[int], max_new_tokens: int = 64,
        policy: CachePolicy | None = None, sampling: SamplingParams | None = None,
        forced_ids: Sequence[int] = (), positions: Sequence[int] | None = None,
    ) -> GenerationResult:
        """Prefill ``prompt`` and sample up to ``max_new_tokens``. ``forced_ids`` are decoded
        after the prompt, through the cache, before sampling starts, as if the model had
        generated them (they count as neither prompt nor output: the policy compresses the
        prompt alone, and they flow through the ring like generated tokens). ``positions``:
        see :meth:`prefill`."""
        ids = self.encode(prompt)
        start, out, ttft_s = time.perf_counter(), [], 0.0
        for token in self._stream(ids, max_new_tokens, policy, sampling, forced_ids, positions):
            out.append(token)
            ttft_s = ttft_s or time.perf_counter() - start
        stop = self.stop_ids(sampling or SamplingParams())
        reason = finish_reason(out[-1], len(out), stop, max_new_tokens)
        text_ids = out[:-1] if reason == STOP_TOKEN else out
        return GenerationResult(token_ids=out, text=self.tokenizer.decode(text_ids),
                                finish_reason=reason, prompt_tokens=len(ids), ttft_s=ttft_s,
                                decode_s=time.perf_counter() - start - ttft_s)

    def stream(
        self, prompt: str | list[int], max_new_tokens: int = 64,
        policy: CachePolicy | None = None, sampling: SamplingParams | None = None,
        forced_ids: Sequence[int] = (),
    ) -> Iterator[int]:
        """The tokens of :meth:`generate` one by one, as they are sampled; the last is a stop
        token or the ``max_new_tokens``-th."""
        ids = self.encode(prompt)
        return self._stream(ids, max_new_tokens, policy, sampling, forced_ids)

    @torch.no_grad()
    def _stream(self, ids: list[int], max_new_tokens: int, policy: CachePolicy | None,
                sampling: SamplingParams | None, forced_ids: Sequence[int],
                positions: Sequence[int] | None = None) -> Iterator[int]:
        """:meth:`stream` of ids already checked by :meth:`encode`."""
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        policy, sampling = policy or self.default_policy, sampling or SamplingParams()
        if not sampling.is_greedy and sampling.seed is None:
            sampling = replace(sampling, seed=secrets.randbits(63))
        bad = [i for i in forced_ids if not 0 <= i < self.config.vocab_size]
        if bad:
            raise ValueError(f"forced_ids {bad[:5]} are outside the vocabulary [0, "
                             f"{self.config.vocab_size})")
        result = self._prefill(ids, policy, max_new_tokens + len(forced_ids),
                               positions=positions)
        decoder = self.new_decoder(result.cache.layout, batch_size=1)
        decoder.cache.insert(0, result.cache)
        stop = self.stop_ids(sampling)
        position, logits = result.cache.next_position, result.logits[None]  # (1, V)
        for forced in forced_ids:  # decoded as if generated, never yielded
            logits = self._step(decoder, forced, position)
            position += 1
        for count in range(1, max_new_tokens + 1):
            token = sample_batch(logits, [sampling], [position])[0]
            yield token
            if finish_reason(token, count, stop, max_new_tokens):
                return
            logits = self._step(decoder, token, position)
            position += 1

    def _step(self, decoder: Decoder, token: int, position: int) -> torch.Tensor:
        """One token at ``position`` through a batch-1 decoder -> logits (1, V)."""
        return decoder.step(torch.tensor([token], device=self.device),
                            torch.tensor([position], device=self.device))
