"""Runner scripts, executed with a peer venv's python (never imported by snapstream, except the
stdlib-only ``peer_protocol`` module that both sides share)."""

from pathlib import Path

RUNNERS = Path(__file__).parent
