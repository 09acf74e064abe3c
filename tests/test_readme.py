"""The README's tour is code users copy: it must run as written."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_blocks_run():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks
    for block in blocks:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["single"].action_space.n == 14


def test_readme_shows_the_two_quickstart_commands():
    text = README.read_text()
    assert "make run" in text and "make test" in text
