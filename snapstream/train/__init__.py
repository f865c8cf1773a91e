"""Training the embedded byte-level model on the project's own retrieval data."""
