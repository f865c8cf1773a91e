"""An in-process Generation server whose behaviour the prompt picks, to test the client alone.

- any text (or token ids): its bytes come back, two per chunk, then GenerateComplete(length);
- ``""`` (text): INVALID_ARGUMENT, as the router answers;
- ``"abort:<CODE>"``: that status code;
- ``"sleep"``: nothing for up to 5 s (for deadlines; a cancelled call ends it early);
- ``"no-complete"``: one chunk, then the stream ends without GenerateComplete.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import grpc

from snapstream.v1 import common_pb2, generation_pb2, generation_pb2_grpc

INFO = generation_pb2.InfoResponse(
    model_name="fake", model_fingerprint="ab12", context_length=4096, vocab_size=264,
    eos_token_ids=[257],
    default_policy=common_pb2.CachePolicy(kind=common_pb2.POLICY_KIND_SNAPSTREAM, n_sink=4,
                                          n_topk=64, n_recent=32, observation=8, kernel=5,
                                          pooling=common_pb2.POOLING_MAX,
                                          observe=common_pb2.OBSERVE_LAST,
                                          unit=common_pb2.UNIT_TOKEN))


class FakeRouter(generation_pb2_grpc.GenerationServicer):
    def __init__(self) -> None:
        self.requests: list[generation_pb2.GenerateRequest] = []

    def Generate(self, request, context):
        self.requests.append(request)
        if request.WhichOneof("input") == "prompt" and request.prompt == "":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt: must not be empty")
        if request.prompt.startswith("abort:"):
            context.abort(grpc.StatusCode[request.prompt.removeprefix("abort:")], "as asked")
        if request.prompt == "sleep":
            deadline = time.monotonic() + 5.0
            while context.is_active() and time.monotonic() < deadline:
                time.sleep(0.01)
            return
        token_ids = list(request.prompt.encode() or request.prompt_token_ids.ids)
        for start in range(0, len(token_ids), 2):
            ids = token_ids[start:start + 2]
            yield generation_pb2.GenerateResponse(
                chunk=generation_pb2.GenerateChunk(token_ids=ids, text=bytes(ids).decode()))
        if request.prompt == "no-complete":
            return
        complete = generation_pb2.GenerateComplete(
            finish_reason=common_pb2.FINISH_REASON_LENGTH, prompt_tokens=len(token_ids),
            completion_tokens=len(token_ids))
        complete.time_to_first_token.FromMilliseconds(12)
        complete.decode_time.FromMilliseconds(1500)
        yield generation_pb2.GenerateResponse(complete=complete)

    def Info(self, request, context):
        return INFO


@contextmanager
def serving(servicer: FakeRouter,
            credentials: grpc.ServerCredentials | None = None) -> Iterator[str]:
    """Runs ``servicer`` on a free port of 127.0.0.1; yields its address."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    generation_pb2_grpc.add_GenerationServicer_to_server(servicer, server)
    address = "127.0.0.1:0"
    port = (server.add_secure_port(address, credentials) if credentials is not None
            else server.add_insecure_port(address))
    server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.stop(grace=None)
