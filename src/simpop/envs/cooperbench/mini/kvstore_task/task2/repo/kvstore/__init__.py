"""kvstore: an in-memory key-value store."""

from kvstore.store import Store

__all__ = ["Store"]
