"""Progress bars that suit where they are shown.

On a terminal a :func:`progress_bar` is an ordinary tqdm bar. Anywhere else (CI logs, a file, a pipe) a bar
that redraws itself with carriage returns leaves thousands of fragments, so there it prints a plain line at
most every ``log_interval`` seconds (and one at the end).
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

#: Seconds between progress lines when the stream is not a terminal.
LOG_INTERVAL_S = 30.0


class _Lines:
    """A stream for tqdm that writes each refresh as a line of its own (no carriage returns)."""

    def __init__(self, stream: TextIO):
        self.stream = stream

    def write(self, text: str) -> None:
        text = text.replace("\r", "").replace("\x1b[A", "").strip()
        if text:
            self.stream.write(text + "\n")

    def flush(self) -> None:
        self.stream.flush()


def progress_bar(total: int | None = None, desc: str | None = None, *, unit: str = "it", initial: int = 0,
                 disable: bool = False, stream: TextIO | None = None, log_interval: float = LOG_INTERVAL_S) -> Any:
    """A tqdm bar on ``stream`` (default stderr): redrawn in place on a terminal, periodic lines elsewhere."""
    from tqdm import tqdm

    stream = sys.stderr if stream is None else stream
    common = {"total": total, "desc": desc, "unit": unit, "initial": initial, "disable": disable}
    if getattr(stream, "isatty", lambda: False)():
        return tqdm(file=stream, **common)
    return tqdm(file=_Lines(stream), mininterval=log_interval, maxinterval=max(log_interval, 10.0), ncols=100,
                ascii=True, **common)
