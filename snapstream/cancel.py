"""Stopping a request's model work when its request is cancelled: the event loop sets a
``Cancel``; the model thread checks it before each layer of a forward and each look-ahead step,
and stops with ``Cancelled``."""

from __future__ import annotations

import threading

import torch

from snapstream.model import AttendFn


class Cancelled(Exception):
    """The request this work was for was cancelled; nobody waits for its result."""


class Cancel:
    """A flag one thread sets (a cancelled request) and another checks (its model work)."""

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def check(self) -> None:
        if self._event.is_set():
            raise Cancelled("the request was cancelled")


def checking(attend: AttendFn, cancel: Cancel | None) -> AttendFn:
    """``attend`` that first checks ``cancel`` (each layer of a forward calls it once)."""
    if cancel is None:
        return attend

    def attend_unless_cancelled(layer_idx: int, q, k, v) -> torch.Tensor:
        cancel.check()
        return attend(layer_idx, q, k, v)

    return attend_unless_cancelled
