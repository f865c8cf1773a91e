"""Compress once, ask many: accuracy and time to first token of questions asked about a cached
document, against the full cache and per-question SnapKV at the same budget.

    python -m evaluation.doccache --model smollm2-135m --tasks niah,realtext \\
        --context-len 2048 --docs 2 --needles 4 --budget 1/4

Each document holds ``--needles`` needles of one task (distinct keys, spread over its depth;
``passkey``: one pass key; ``multiquestion``: the workload's five, evaldata.document); each
needle is asked in turn. ``after``: the document is the
system message (cached once, its compression timed), the question the user's; ``before``: one
user message with the question before the document, stored (each question its own document),
the template's opening of the answer as the suffix (shorter than SnapKV's observation window: the
message's opening paragraph, the question, is read again as the probe). The answer cue is
decoded after compression, as the evaluation does. Prints a table; ``--ttft-doc-len`` adds
the time to first token of a question on the cached document against a full re-prefill of
document + question.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from dataclasses import replace

import torch

from evaldata import values
from evaldata.document import Ask, multiquestion
from evaldata.filler import corpus
from evaldata.layout import Draft, Insert, PromptSpec, build_sample
from evaldata.phrasing import PHRASES
from evaldata.sample import TaskConfig
from evaldata.scoring import exact_match
from evaluation.budget import Budget, SplitRule
from evaluation.needles import held_share
from evaluation.results import markdown_header, markdown_row
from kvstore.codec import BlobSpec, decode_blob, encode_blob
from kvstore.seal import ClusterSecret, Seal
from snapstream.chat import ChatMessage
from snapstream.checkpoints.registry import MODEL_HELP
from snapstream.engine import Engine, PrefillResult
from snapstream.kvcache import SequenceCache
from snapstream.policy import CachePolicy
from snapstream.prefix_config import SCORES, STORES, DocumentCacheConfig

NEEDLE_KEYS: dict[str, Callable[[random.Random], str]] = {
    "niah": values.label, "realtext": values.function_name}
NAME_FIELD = {"niah": "key", "realtext": "name"}
TASKS = ("passkey", *NEEDLE_KEYS, "multiquestion")
CORPUS = {"passkey": "classic"}  # the classic test's grass-and-sky noise; the rest prose
PASSKEY_NAME = "pass key"  # the words of the passkey's sentence that name it


def build_document(task: str, rng: random.Random, engine: Engine, context_len: int,
                   num_needles: int) -> tuple[str, list[Ask]]:
    """A document of ~``context_len`` tokens with ``num_needles`` needles of ``task`` at
    spread depths (``passkey``: one, in the middle; its needle has no name; ``multiquestion``:
    the workload's, :data:`evaldata.document.NUM_QUESTIONS` needles) -> its text and each
    needle's :class:`Ask`."""
    if task == "multiquestion":
        document = multiquestion(rng, context_len, engine.tokenizer)
        return document.text, list(document.asks)
    phrases = PHRASES[task]
    if task in NAME_FIELD:
        field = NAME_FIELD[task]
        keys = values.distinct(rng, NEEDLE_KEYS[task], num_needles)
    else:  # one pass key: a second would contradict it
        field, keys = "key", [PASSKEY_NAME]  # the fact has no {key}: format ignores it
    num_needles = len(keys)
    numbers = values.distinct(rng, values.number, num_needles)
    inserts = tuple(Insert(phrases.fact.format(**{field: key}, value=number),
                           (i + 1) / (num_needles + 1), True)
                    for i, (key, number) in enumerate(zip(keys, numbers, strict=True)))
    question = phrases.question.format(**{field: keys[0]})
    draft = Draft(intro=phrases.intro, inserts=inserts, question=question, cue="",
                  answers=(numbers[0],), filler=corpus(CORPUS.get(task, "prose")))
    sample = build_sample(task, draft, rng, TaskConfig(context_len=context_len),
                          PromptSpec(engine.tokenizer, "raw"))
    start = sample.prompt.index(phrases.intro)
    doc = sample.prompt[start : sample.prompt.index(f"\n\n{question}", start)]
    asks = [Ask(phrases.question.format(**{field: k}), phrases.cue.format(**{field: k}), n, k,
                insert.text) for k, n, insert in zip(keys, numbers, inserts, strict=True)]
    return doc, asks


def answer(engine: Engine, result: PrefillResult, prompt_len: int, cue: str,
           max_new: int = 12) -> str:
    """Greedy answer after the forced cue, decoded through ``result``'s cache."""
    decoder = engine.new_decoder(result.cache.layout, batch_size=1)
    decoder.cache.insert(0, result.cache)
    forced = engine.tokenizer.inner.encode(cue, add_special_tokens=False).ids
    logits, position, out = result.logits[None], prompt_len, []
    for token in forced + [None] * max_new:
        if token is None:
            token = int(logits.argmax())
            out.append(token)
            if token in engine.tokenizer.eos_token_ids:
                break
        logits = decoder.step(torch.tensor([token]), torch.tensor([position]))
        position += 1
    return engine.tokenizer.decode(out)


def split(engine: Engine, messages: list[ChatMessage], count: int) -> tuple[list[int], int]:
    head, rest = engine.tokenizer.render_chat_split(messages, count)
    return engine.tokenizer.encode_prefixed(head, rest)


def needle_tokens(engine: Engine, messages: list[ChatMessage], ask: Ask) -> dict[str, list[int]]:
    """The prompt positions of the needle's sentence (``fact``), its name (``key``) and its
    number (``value``): the tokens whose characters overlap each, in the cached first message."""
    head, _ = engine.tokenizer.render_chat_split(messages, 1)
    _, offsets = engine.tokenizer.encode_with_offsets(head)
    start = head.index(ask.fact)
    spans = {"fact": (start, start + len(ask.fact))}
    for part, text in (("key", ask.key), ("value", ask.answer)):
        begin = start + ask.fact.index(text)
        spans[part] = (begin, begin + len(text))
    return {part: [i for i, (a, b) in enumerate(offsets) if a < end and b > begin]
            for part, (begin, end) in spans.items()}


def shares(cache: SequenceCache, needle: dict[str, list[int]]) -> str:
    return "/".join(f"{held_share(cache, tokens):.2f}" for tokens in needle.values())


def kept_whole(policy: CachePolicy, doc_config: DocumentCacheConfig, doc_len: int
               ) -> tuple[CachePolicy, DocumentCacheConfig]:
    """A policy, and the document config it reads the stored cache of a ``doc_len``-token
    document under, whose question keeps every stored pick (``superset`` x ``n_topk``; the
    whole document's when it is stored whole) but a few of the document's last tokens (those the
    question pushes out of the ring compete too); the upper bound of the question's
    selection."""
    if doc_config.store == "whole":
        return replace(policy, n_topk=doc_len - policy.n_sink - policy.n_recent), doc_config
    return (replace(policy, n_topk=doc_config.superset * policy.n_topk),
            replace(doc_config, superset=1))


def run_document(engine: Engine, doc: str, asks: list[Ask], budget: Budget, placement: str,
                 doc_config: DocumentCacheConfig, baselines: bool = True) -> dict:
    """Correct answers per method, and the seconds of each step. Prints one line a question:
    each method's answer, and the share of the needle's sentence / name / number that the
    stored document and the question's final cache hold. ``whole``: the document cache with
    (nearly) every stored key kept (:func:`kept_whole`)."""
    rule = SplitRule.from_policy(engine.default_policy)
    correct = {"full": 0, "snapkv": 0, "doccache": 0, "whole": 0}
    times = {"compress": 0.0, "suffix": 0.0, "full": 0.0}
    stored = policy = None
    for ask in asks:
        if placement == "after":
            messages = [ChatMessage("system", doc), ChatMessage("user", ask.question)]
        else:
            messages = [ChatMessage("user", f"{ask.question}\n\n{doc}")]
        ids, n_prefix = split(engine, messages, 1)
        # one policy per document (the budget of its first prompt): the stored cache is for it
        policy = policy or rule.policy("snapstream", budget.tokens_for(len(ids)))
        answers = {}
        if baselines:
            start = time.perf_counter()
            full = engine.prefill(ids, CachePolicy(kind="full"), 16)
            times["full"] += time.perf_counter() - start
            answers["full"] = answer(engine, full, len(ids), " " + ask.cue)
            snap = engine.prefill(ids, policy, 16)
            answers["snapkv"] = answer(engine, snap, len(ids), " " + ask.cue)
        if stored is None or placement == "before":
            start = time.perf_counter()
            stored = engine.compress_prefix(ids[:n_prefix], policy, 16, doc_config=doc_config)
            times["compress"] += time.perf_counter() - start
        start = time.perf_counter()
        reused = engine.prefill_on_prefix(stored, ids, policy, 16, doc_config=doc_config)
        times["suffix"] += time.perf_counter() - start
        answers["doccache"] = answer(engine, reused, len(ids), " " + ask.cue)
        wide_policy, wide_config = kept_whole(policy, doc_config, n_prefix)
        whole = engine.prefill_on_prefix(stored, ids, wide_policy, 16, doc_config=wide_config)
        answers["whole"] = answer(engine, whole, len(ids), " " + ask.cue)
        for method, text in answers.items():
            correct[method] += exact_match((ask.answer,), text)
        needle = needle_tokens(engine, messages, ask)
        print(f"#   {placement} {ask.key}={ask.answer}: "
              + ", ".join(f"{m} {text!r}" for m, text in answers.items())
              + f"; fact/key/value held: stored {shares(stored, needle)}, "
              f"final {shares(reused.cache, needle)}", flush=True)
    return {"correct": correct, "times": times, "asked": len(asks)}


def measure_ttft(engine: Engine, doc_len: int, repeats: int,
                 doc_config: DocumentCacheConfig) -> dict:
    """Seconds to the first token's logits of a question on a cached ``doc_len``-token document
    (read back from its blob, as a served question is) against a full re-prefill (the
    document compressed per question by SnapKV); the blob's size and codec times."""
    rng = random.Random(0)
    doc, asks = build_document("niah", rng, engine, doc_len, 2)
    rule = SplitRule.from_policy(engine.default_policy)
    messages = [ChatMessage("system", doc), ChatMessage("user", asks[0].question)]
    ids, n_prefix = split(engine, messages, 1)
    policy = rule.policy("snapstream", Budget.parse("1/4").tokens_for(len(ids)))
    start = time.perf_counter()
    stored = engine.compress_prefix(ids[:n_prefix], policy, 16, doc_config=doc_config)
    compress_s = time.perf_counter() - start
    spec = BlobSpec.for_model(engine.config, bytes(32), engine.kv_dtype)
    start = time.perf_counter()
    seal = Seal(ClusterSecret(b"the evaluation's cluster secret"), "document")
    blob = encode_blob(stored, spec, seal)
    encode_s = time.perf_counter() - start
    start = time.perf_counter()
    stored = decode_blob(blob, spec, seal)  # what a served question reads back from the store
    decode_s = time.perf_counter() - start
    full_s, suffix_s = [], []
    for ask in asks[:repeats]:
        ids, _ = split(engine, [ChatMessage("system", doc), ChatMessage("user", ask.question)],
                       1)
        start = time.perf_counter()
        engine.prefill(ids, policy, 16)
        full_s.append(time.perf_counter() - start)
        start = time.perf_counter()
        engine.prefill_on_prefix(stored, ids, policy, 16, doc_config=doc_config)
        suffix_s.append(time.perf_counter() - start)
    return {"doc_tokens": n_prefix, "compress_s": compress_s, "full_s": min(full_s),
            "suffix_s": min(suffix_s), "policy": policy, "blob_bytes": len(blob),
            "kv_dtype": engine.kv_dtype, "encode_s": encode_s, "decode_s": decode_s}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help=MODEL_HELP)
    parser.add_argument("--tasks", default="niah,realtext",
                        help=f"comma-separated, of {','.join(TASKS)}")
    parser.add_argument("--context-len", type=int, default=2048)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--needles", type=int, default=4)
    parser.add_argument("--budget", default="1/4")
    parser.add_argument("--placements", default="after,before")
    parser.add_argument("--ttft-doc-len", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--torch-threads", type=int, default=0,
                        help="torch threads (0: torch's default, one per core)")
    parser.add_argument("--prefix-score", default=DocumentCacheConfig.score,
                        choices=SCORES, help="the store-time scorer")
    parser.add_argument("--prefix-superset", type=int, default=DocumentCacheConfig.superset,
                        help="superset picks per request pick")
    parser.add_argument("--prefix-store", default=DocumentCacheConfig.store, choices=STORES,
                        help="store the whole document or its superset alone")
    parser.add_argument("--no-baselines", action="store_true",
                        help="skip the full cache and per-question SnapKV")
    args = parser.parse_args(argv)
    if unknown := set(args.tasks.split(",")) - set(TASKS):
        parser.error(f"--tasks: unknown {sorted(unknown)}; choose from {','.join(TASKS)}")
    doc_config = DocumentCacheConfig(args.prefix_score, args.prefix_superset,
                                     args.prefix_store)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    engine = Engine.from_pretrained(args.model)
    engine.prefill(list(range(1000, 1200)), engine.default_policy, 1)  # weights laid out once
    budget = Budget.parse(args.budget)
    if args.ttft_doc_len:
        t = measure_ttft(engine, args.ttft_doc_len, repeats=2, doc_config=doc_config)
        print(f"TTFT at {t['doc_tokens']} document tokens ({t['policy']}): full re-prefill "
              f"{t['full_s']:.2f} s, cached document {t['suffix_s']:.3f} s "
              f"({t['full_s'] / t['suffix_s']:.1f}x); compressing the document once "
              f"{t['compress_s']:.2f} s; its blob {t['blob_bytes'] / 1e6:.1f} MB "
              f"({t['kv_dtype']}), encoded in {t['encode_s'] * 1e3:.0f} ms, read back "
              f"(decode_blob) in {t['decode_s'] * 1e3:.1f} ms")
    print(markdown_header(["task", "placement", "asked", "full", f"snapkv {args.budget}",
                           f"doccache {args.budget}", "doccache, stored kept",
                           "compress s", "suffix s / question",
                           "full prefill s / question"]))
    for task in args.tasks.split(","):
        for placement in args.placements.split(","):
            total = {"full": 0, "snapkv": 0, "doccache": 0, "whole": 0}
            times = {"compress": 0.0, "suffix": 0.0, "full": 0.0}
            asked = 0
            for d in range(args.docs):
                rng = random.Random(args.seed * 1000 + d)
                doc, asks = build_document(task, rng, engine, args.context_len, args.needles)
                out = run_document(engine, doc, asks, budget, placement, doc_config,
                                   baselines=not args.no_baselines)
                asked += out["asked"]
                total = {k: total[k] + out["correct"][k] for k in total}
                times = {k: times[k] + out["times"][k] for k in times}
            if not asked:
                continue
            print(markdown_row([task, placement, asked, total["full"], total["snapkv"],
                                total["doccache"], total["whole"],
                                f"{times['compress']:.1f}",
                                f"{times['suffix'] / asked:.2f}",
                                f"{times['full'] / asked:.2f}"]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
