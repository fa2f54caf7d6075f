"""The HTTP listener (FastAPI): read-only on loopback; mutations need the token."""
