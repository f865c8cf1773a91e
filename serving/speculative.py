"""Speculative prefill settings and reports <-> protobuf (torch-free: the router uses it)."""

from __future__ import annotations

from dataclasses import replace

from serving.errors import RequestError
from snapstream.specprefill.settings import SpeculativeSettings
from snapstream.v1 import common_pb2

POSITIONS_TO_PB = {"original": common_pb2.POSITION_MODE_ORIGINAL,
                   "compact": common_pb2.POSITION_MODE_COMPACT}
POSITIONS_FROM_PB = {v: k for k, v in POSITIONS_TO_PB.items()}


def speculative_from_pb(msg: common_pb2.SpeculativeSettings, default: SpeculativeSettings
                        ) -> SpeculativeSettings:
    """Unset fields take ``default``'s; raises RequestError naming a bad field."""
    if msg.positions not in POSITIONS_FROM_PB and msg.positions != 0:
        raise RequestError(f"speculative.positions: unknown value {msg.positions}",
                           field="speculative.positions")
    given: dict = {name: getattr(msg, name) for name in ("chunk_size", "look_ahead")
                   if msg.HasField(name)}
    size = msg.WhichOneof("size")
    if size is not None:
        other = "keep_tokens" if size == "keep" else "keep"
        given |= {size: getattr(msg, size), other: None}
    if msg.positions in POSITIONS_FROM_PB:
        given["positions"] = POSITIONS_FROM_PB[msg.positions]
    try:
        return replace(default, **given)
    except ValueError as exc:
        raise RequestError(str(exc), field="speculative") from None


def speculative_to_pb(settings: SpeculativeSettings) -> common_pb2.SpeculativeSettings:
    msg = common_pb2.SpeculativeSettings(chunk_size=settings.chunk_size,
                                         look_ahead=settings.look_ahead,
                                         positions=POSITIONS_TO_PB[settings.positions])
    if settings.keep_tokens is not None:
        msg.keep_tokens = settings.keep_tokens
    else:
        msg.keep = settings.keep
    return msg
