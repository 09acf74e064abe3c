"""simpop sandbox: no network for this process (fallback when network namespaces are unavailable).

:func:`simpop.envs.cooperbench.sandbox.write_socket_guard` copies this file as ``sitecustomize.py``
into a folder on a contained run's ``PYTHONPATH``: every Python process there imports it at start-up,
and its sockets then refuse every connection that is not a Unix one. Imported under its own name it
changes nothing. It imports only ``socket`` (which imports ``collections.abc``).
"""

import socket
from collections.abc import Callable


def _guarded(method: Callable[..., object]) -> Callable[..., object]:
    def guarded(self: socket.socket, *args: object) -> object:
        if self.family != getattr(socket, "AF_UNIX", None):
            raise PermissionError("network access is disabled in the simpop sandbox")
        return method(self, *args)

    return guarded


def install() -> None:
    """Make ``connect``, ``connect_ex`` and ``sendto`` refuse every socket but a Unix one."""
    for name in ("connect", "connect_ex", "sendto"):
        setattr(socket.socket, name, _guarded(getattr(socket.socket, name)))


if __name__ == "sitecustomize":
    install()
