"""arbiter: share one GPU between protected programs and other GPU work."""

__version__ = "0.1.0"
