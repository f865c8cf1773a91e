"""A model's identity for blobs: a hash of its architecture and of every weight it computes with."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict

import torch

from snapstream.model import Transformer

FINGERPRINT_BYTES = 32


def model_fingerprint(model: Transformer) -> bytes:
    """32-byte BLAKE2b over the config and the (name, dtype, shape, bytes) of each tensor."""
    digest = hashlib.blake2b(digest_size=FINGERPRINT_BYTES)
    digest.update(json.dumps(asdict(model.config), sort_keys=True).encode())
    for name, tensor in sorted(model.state_dict().items()):
        flat = tensor.detach().contiguous().cpu().view(-1).view(torch.uint8)
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(flat.numpy().data)
    return digest.digest()
