"""The errors of a blob that cannot be used (torch-free: the services' status table names them).

:func:`kvstore.codec.decode_blob` raises the subclass that names the problem.
"""

from __future__ import annotations


class BlobError(ValueError):
    """A blob that cannot be used; the subclass names the problem."""


class BlobTruncated(BlobError): ...


class BlobCorrupted(BlobError): ...


class BlobForged(BlobCorrupted):
    """The blob fails its MAC: not written by a holder of the cluster secret for this key, or
    altered since (corruption reads the same)."""


class BlobTokensMismatch(BlobError):
    """The blob's cache was made from other token ids than the reader expects."""


class BlobVersionMismatch(BlobError): ...


class BlobModelMismatch(BlobError): ...


class BlobLayoutMismatch(BlobError): ...
