"""OpenAI-compatible HTTP API of the router: request bodies (schemas), their conversion into
the native GenerateRequest (convert), responses and server-sent events (frames), errors, the
Starlette app and the uvicorn server it runs in, on the router's event loop."""
