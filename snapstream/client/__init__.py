"""Client SDK of the public ``snapstream.v1.Generation`` service (blocking and asyncio).

```python
from snapstream.client import SnapstreamClient

with SnapstreamClient("localhost:50051", timeout_s=60) as client:
    for chunk in client.generate_stream("The passkey is", max_new_tokens=16, stop="\\n"):
        print(chunk.text, end="", flush=True)
    completion = client.generate([72, 105], temperature=0.0, policy="snapstream")
    answer = client.chat([{"role": "user", "content": "Name three primary colors."}])
```

Options left out (or None) take the server's defaults. Every failure raises a
:class:`SnapstreamError` subclass chosen by the gRPC status code (``ERRORS``). Torch-free.
"""

from snapstream.client.aio import AsyncGenerationStream, AsyncSnapstreamClient
from snapstream.client.errors import (
    ERRORS,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    SnapstreamError,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from snapstream.client.request import (
    GenerateOptions,
    Messages,
    Prompt,
    build_chat_request,
    build_request,
)
from snapstream.client.results import Chunk, Completion, ModelInfo, SpeculativeUsage
from snapstream.client.sync import GenerationStream, SnapstreamClient
from snapstream.client.tls import TlsConfig

__all__ = [
    "ERRORS",
    "AsyncGenerationStream",
    "AsyncSnapstreamClient",
    "Cancelled",
    "Chunk",
    "Completion",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GenerateOptions",
    "GenerationStream",
    "Internal",
    "InvalidArgument",
    "Messages",
    "ModelInfo",
    "NotFound",
    "PermissionDenied",
    "Prompt",
    "ResourceExhausted",
    "SnapstreamClient",
    "SnapstreamError",
    "SpeculativeUsage",
    "TlsConfig",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "build_chat_request",
    "build_request",
]
