"""An in-memory key-value store."""

_MISSING = object()


class Store:
    """A dict-backed store."""

    def __init__(self):
        self._data = {}

    def set(self, key, value):
        """Store ``value`` under ``key``."""
        self._data[key] = value

    def get(self, key, default=None):
        """The value under ``key``, or ``default`` if there is none."""
        return self._data.get(key, default)

    def delete(self, key):
        """Remove ``key``; return whether it was there."""
        return self._data.pop(key, _MISSING) is not _MISSING

    def __repr__(self):
        return f"Store({len(self._data)} keys)"
