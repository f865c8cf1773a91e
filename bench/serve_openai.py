"""The serving benchmark's load generator over the OpenAI API, for any OpenAI-compatible server
(ours, llama.cpp's, vLLM's): streamed ``/v1/completions`` with the prompt as token ids, so every
system gets the same tokens.

A token's arrival is stamped when the client hands over the event that carries it. A server
that says which tokens an event carries (ours, asked with ``snapstream.return_token_ids``) has
each of them stamped, as the gRPC client stamps the tokens of a chunk; an event from any other
server counts as one token when it has text. TTFT is request sent -> first token.
"""

from __future__ import annotations

import time

import openai

from bench.serve_workload import RequestTrace, ServeBenchConfig

API_KEY = "unused"  # servers without keys ignore it; the client needs one


async def served_model(client: openai.AsyncOpenAI) -> str:
    """The first model the server lists: what a single-model server serves."""
    models = await client.models.list()
    if not models.data:
        raise ValueError(f"{client.base_url} lists no model")
    return models.data[0].id


class OpenAIClient:
    """Greedy streamed completions with the benchmark's policy (in our ``snapstream``
    extension object, which other servers ignore)."""

    def __init__(self, client: openai.AsyncOpenAI, model: str, cfg: ServeBenchConfig) -> None:
        policy = cfg.policy
        self.client, self.model, self.max_tokens = client, model, cfg.max_new_tokens
        self.extension = {"snapstream": {
            "policy": policy.kind, "n_sink": policy.n_sink, "n_topk": policy.n_topk,
            "n_recent": policy.n_recent, "observation": policy.observation, "kernel": policy.kernel,
            "pooling": policy.pooling, "return_token_ids": True}, **dict(cfg.openai_fields)}

    async def generate(self, ids: list[int]) -> RequestTrace:
        arrivals: list[float] = []
        token_ids: list[int] = []
        sent = time.perf_counter()
        stream = await self.client.completions.create(
            model=self.model, prompt=ids, max_tokens=self.max_tokens, temperature=0.0,
            stream=True, extra_body=self.extension)
        async for chunk in stream:
            now = time.perf_counter()
            for choice in chunk.choices:
                carried = (choice.model_extra or {}).get("token_ids")
                count = len(carried) if carried is not None else int(bool(choice.text))
                arrivals += [now] * count
                token_ids += carried or ()
        return RequestTrace(sent, tuple(arrivals), tuple(token_ids))
