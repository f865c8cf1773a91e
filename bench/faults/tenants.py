"""The faults benchmark's tenant cases: the cluster asks for the keys of two tenants, and each
case sends the same document from one or both and reports what the document cache said
(``prefix_cache``: stored, hit), or the status a request ended with."""

from __future__ import annotations

import secrets
from pathlib import Path

import grpc

from snapstream.v1 import common_pb2, generation_pb2, generation_pb2_grpc

TENANTS = ("load", "other")  # "load" drives every other scenario
STATES = {common_pb2.PREFIX_CACHE_STORED: "stored", common_pb2.PREFIX_CACHE_HIT: "hit",
          common_pb2.PREFIX_CACHE_BYPASS: "bypass",
          common_pb2.PREFIX_CACHE_UNSPECIFIED: "none"}


def write_keys(path: Path) -> dict[str, str]:
    """A keys file of TENANTS ('NAME KEY' lines, mode 0600) -> tenant -> key."""
    keys = {tenant: secrets.token_urlsafe(24) for tenant in TENANTS}
    path.touch(mode=0o600)
    path.write_text("".join(f"{tenant} {key}\n" for tenant, key in keys.items()))
    return keys


async def document_state(router: str, key: str, document: str, salt: str = "") -> str:
    """What the document cache did with ``document`` for the tenant of ``key`` (or the status
    the request ended with)."""
    request = generation_pb2.GenerateRequest(prompt=document + " Which item costs most?",
                                             max_new_tokens=2,
                                             cache_prefix_chars=len(document), cache_salt=salt)
    state = "no answer"
    async with grpc.aio.insecure_channel(router) as channel:
        try:
            async for message in generation_pb2_grpc.GenerationStub(channel).Generate(
                    request, metadata=(("authorization", f"Bearer {key}"),), timeout=120):
                if message.HasField("complete"):
                    state = STATES[message.complete.prefix_cache]
        except grpc.aio.AioRpcError as err:
            return err.code().name
    return state


async def tenant_cases(router: str, keys: dict[str, str], round_: int) -> dict[str, str]:
    """One round of the cases (a new document each round) -> case -> what was seen."""
    load, other = (keys[tenant] for tenant in TENANTS)
    document = " ".join(f"Round {round_}, item {i} costs {i * 37 % 1000} coins."
                        for i in range(40))
    first = await document_state(router, load, document)
    theirs = await document_state(router, other, document)
    again = await document_state(router, load, document)
    salted = await document_state(router, load, document, salt=f"salt-{round_}")
    stranger = await document_state(router, "not-a-key-" + "x" * 16, document)
    return {"one document, tenant A then tenant B": f"{first}, {theirs}",
            "tenant A again": again,
            "tenant A with a cache_salt": salted,
            "a key of no tenant": stranger}
