"""`snapstream bench faults`: the cluster under faults (decode and prefill kills, store
restarts, poison requests, a soak), counted as requests lost, outputs different from an
undisturbed run, streams hung, blobs and rows leaked, and recovery time (docs/reliability.md)."""
