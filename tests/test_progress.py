"""Progress bars: redrawn on a terminal, periodic plain lines in logs."""

from __future__ import annotations

import io

from simpop.progress import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_a_few_plain_lines_not_carriage_return_fragments():
    log = io.StringIO()
    bar = progress_bar(1000, "collapse", unit="update", stream=log, log_interval=3600)
    for _ in range(1000):
        bar.update(1)
    bar.close()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and 1 <= len(lines) <= 3  # the start and the end; nothing in between
    assert lines[-1].startswith("collapse: 100%") and "1000/1000" in lines[-1]


def test_a_terminal_gets_the_redrawn_bar_and_disabled_bars_print_nothing():
    terminal = Terminal()
    bar = progress_bar(10, "eval", stream=terminal)
    for _ in range(10):
        bar.update(1)
    bar.close()
    assert "\r" in terminal.getvalue()
    quiet = io.StringIO()
    bar = progress_bar(10, "eval", stream=quiet, disable=True)
    bar.update(10)
    bar.close()
    assert quiet.getvalue() == ""
