"""Eval prompts through transformers and through snapstream, on identical token ids: is a
failure the model's (both miss) or ours (they differ)?

For each length, one sample of ``--task`` in ``--prompt-format`` (default: the model's own),
its answer cue forced after the prompt as `snapstream eval` does; prints, per length, the mean
negative log-likelihood of the answer's tokens under transformers (its GGUF loader, SDPA,
float32) and under snapstream's model (float32), the largest logit difference over the answer
positions, and both greedy continuations (snapstream's through its full-cache decode).

    python -m evaluation.hf_parity --model gemma3-270m --task passkey --context-lens 1024,4096
"""

from __future__ import annotations

import argparse
import random

import torch

from evaldata import PromptSpec, TaskConfig, generate, model_format
from evaluation.results import markdown_header, markdown_row
from snapstream.checkpoints.registry import MODEL_HELP, model_path

NEW_TOKENS = 10


def _answer_nll(logits: torch.Tensor, targets: list[int]) -> float:
    """logits (T, V) predicting ``targets`` (T,) -> their mean negative log-likelihood."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)  # (T, V)
    return -log_probs.gather(1, torch.tensor(targets)[:, None]).mean().item()


@torch.no_grad()
def compare(engine, reference, task: str, context_len: int, prompt_format: str) -> dict:
    from snapstream import CachePolicy, SamplingParams

    tokenizer = engine.tokenizer
    sample = generate(task, random.Random(f"hf_parity/{task}/{context_len}"),
                      TaskConfig(context_len=context_len), PromptSpec(tokenizer, prompt_format))
    head = sample.prompt.removesuffix(sample.cue)
    prompt = head.rstrip(" ")
    no_bos = len(tokenizer.encode(""))
    prompt_ids = tokenizer.encode(prompt)
    cue_ids = tokenizer.encode(head[len(prompt):] + sample.cue)[no_bos:]
    answer_ids = tokenizer.encode(" " + sample.answer)[no_bos:]
    ids = torch.tensor([prompt_ids + cue_ids + answer_ids])  # (1, T)
    keep = len(answer_ids) + 1  # logits predicting each answer token, and the one after
    expected = reference(ids, logits_to_keep=keep).logits[0]  # (keep, V)
    model = engine.model
    hidden = model(ids, torch.arange(ids.shape[1])[None], model.causal_attend)[0]  # (T, h)
    got = model.logits(hidden[-keep:])  # (keep, V)
    ref_ids = reference.generate(torch.tensor([prompt_ids + cue_ids]), do_sample=False,
                                 max_new_tokens=NEW_TOKENS)[0, len(prompt_ids + cue_ids):]
    ours = engine.generate(prompt_ids, max_new_tokens=NEW_TOKENS, policy=CachePolicy(kind="full"),
                           sampling=SamplingParams(temperature=0), forced_ids=cue_ids)
    return {"tokens": len(prompt_ids), "answer": sample.answer,
            "nll_transformers": _answer_nll(expected[:-1], answer_ids),
            "nll_snapstream": _answer_nll(got[:-1], answer_ids),
            "max_logit_diff": (got - expected).abs().max().item(),
            "transformers": tokenizer.decode(ref_ids.tolist()), "snapstream": ours.text}


def main(argv: list[str] | None = None) -> int:
    import transformers

    from snapstream import Engine

    parser = argparse.ArgumentParser(prog="python -m evaluation.hf_parity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="gemma3-270m", help=MODEL_HELP)
    parser.add_argument("--task", default="passkey")
    parser.add_argument("--context-lens", default="1024,2048,4096")
    parser.add_argument("--prompt-format", default=None,
                        help="raw or chat (default: the model's own)")
    args = parser.parse_args(argv)
    path = model_path(args.model)
    engine = Engine.from_pretrained(str(path), dtype="float32")
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32,
        attn_implementation="sdpa").eval()
    fmt = args.prompt_format or model_format(engine.tokenizer)
    print(markdown_header(["tokens", "answer", "NLL transformers", "NLL snapstream",
                           "max logit diff", "transformers writes", "snapstream writes"]))
    for context_len in map(int, args.context_lens.split(",")):
        r = compare(engine, reference, args.task, context_len, fmt)
        print(markdown_row([r["tokens"], r["answer"], f"{r['nll_transformers']:.3f}",
                            f"{r['nll_snapstream']:.3f}", f"{r['max_logit_diff']:.1e}",
                            repr(r["transformers"]), repr(r["snapstream"])]), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
