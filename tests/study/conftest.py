"""Fixtures of the study tests: a study on P4G text with cheap policies, and its app served on loopback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

pytest.importorskip("fastapi", reason="the study extra is not installed (pip install simpop[study])")

import uvicorn  # noqa: E402

from simpop.study.app import create_app  # noqa: E402
from simpop.study.study import open_study  # noqa: E402

ENV = "simpop/Persuasion-v1"
TOKEN = "test-token-123"
#: A: the reference persuader; B: a deterministic asker (tests/study/policies.py). Both instant.
POLICIES = {"A": "reference", "B": "tests.study.policies:Asker"}


def make_study(out, policies=POLICIES, **kwargs):
    kwargs.setdefault("env_kwargs", {"max_turns": 3})
    return open_study(out, ENV, policies, seed=kwargs.pop("seed", 0), **kwargs)


@pytest.fixture
def study(tmp_path):
    s = make_study(tmp_path / "study")
    yield s
    s.close()


class Server:
    """``app`` served by uvicorn on a free loopback port, in a thread."""

    def __init__(self, app):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the study server did not start")
            time.sleep(0.02)
        return f"http://127.0.0.1:{self.port}"

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(study):
    """(base url, study) with a real server; message rate loosened so tests type fast."""
    with Server(create_app(study, TOKEN, message_rate="50/second")) as url:
        yield url, study
