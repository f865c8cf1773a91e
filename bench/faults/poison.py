"""Requests meant to hurt the cluster, as raw bodies of ``Generation/Generate``: each must end
with OK or a client error (INVALID_ARGUMENT, OUT_OF_RANGE, RESOURCE_EXHAUSTED) and leave every
other stream alone."""

from __future__ import annotations

import grpc

from snapstream.v1 import common_pb2, generation_pb2

LONG = "a needle in a long haystack of words " * 60


def _request(**fields: object) -> bytes:
    return generation_pb2.GenerateRequest(max_new_tokens=8, **fields).SerializeToString()


def _sampling(**fields: object) -> common_pb2.SamplingParams:
    return common_pb2.SamplingParams(**fields)


POISON: dict[str, bytes] = {
    "temperature 2.17e-38": _request(prompt=LONG, sampling=_sampling(temperature=2.17e-38)),
    "temperature 1e-45": _request(prompt=LONG, sampling=_sampling(temperature=1e-45)),
    "temperature nan": _request(prompt="hi", sampling=_sampling(temperature=float("nan"))),
    "kernel 2^32-1, max pooling": _request(prompt=LONG, policy=common_pb2.CachePolicy(
        kernel=2**32 - 1, pooling=common_pb2.POOLING_MAX)),
    "kernel 2^31+1, avg pooling": _request(prompt=LONG, policy=common_pb2.CachePolicy(
        kernel=2**31 + 1, pooling=common_pb2.POOLING_AVG)),
    "n_topk 2^32-1": _request(prompt=LONG, policy=common_pb2.CachePolicy(n_topk=2**32 - 1)),
    "prompt token out of vocabulary": _request(
        prompt_token_ids=common_pb2.TokenIds(ids=[1, 2, 2**32 - 1])),
    "stop token out of vocabulary": _request(prompt="hi", sampling=_sampling(
        stop_token_ids=[2**32 - 1])),
    "max_new_tokens 2^32-1": generation_pb2.GenerateRequest(
        prompt="hi", max_new_tokens=2**32 - 1).SerializeToString(),
    "invalid UTF-8 prompt": b"\x0a\x02\xff\xfe",
    "invalid UTF-8 stop": b"\x0a\x02hi\x22\x04\x2a\x02\xc3\x28",
    "truncated body": b"\x0a\x09abc",
}


async def send_raw(router: str, body: bytes, api_key: str, timeout_s: float = 60.0) -> str:
    """The status the router ends the stream with (its name; OK for a full stream)."""
    async with grpc.aio.insecure_channel(router) as channel:
        call = channel.unary_stream("/snapstream.v1.Generation/Generate")(
            body, timeout=timeout_s, metadata=(("authorization", f"Bearer {api_key}"),))
        try:
            async for _ in call:
                pass
        except grpc.aio.AioRpcError as err:
            return err.code().name
    return "OK"
