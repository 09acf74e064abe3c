"""``simpop train`` and ``simpop eval`` when the model server a simulator talks to is killed mid-run: one line,
exit 1, the finished work kept (checkpoints, episodes), and ``--resume`` against a restarted server finishes the
run exactly as an uninterrupted one (before, train ended in a traceback and eval recorded every remaining episode
as a policy failure).

The killed server is a real ``simpop serve`` process (a tiny random Llama with SmolLM2's tokenizer) on loopback; the
restarted one is the same server (:func:`~simpop.serve.server.make_server`, what ``simpop serve`` runs) started in
the test's process on the same address. The client path is :class:`~simpop.agents.openai_backend.OpenAIBackend`'s,
which vLLM generators share.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx

from simpop import checkpoint
from simpop.agents import load_backend
from simpop.agents.vllm_server import free_port
from simpop.cli import main
from simpop.serve.server import SimpopServer, make_server

UPDATES = 3


class Served:
    """``simpop serve`` of ``model`` on ``port`` in a child process."""

    def __init__(self, model, port: int):
        self.url = f"http://127.0.0.1:{port}/v1"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        self.process = subprocess.Popen(
            [sys.executable, "-m", "simpop.cli", "serve", "--model", f"transformers:{model}", "--name", "tiny",
             "--port", str(port), "--threads", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 120
        while True:
            assert self.process.poll() is None, self.process.stderr.read().decode()  # type: ignore[union-attr]
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "simpop serve did not come up in 120 s"
            time.sleep(0.2)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)


def restarted(model, port: int) -> SimpopServer:
    """The killed server back on ``port``, in this process (no second interpreter start), as ``simpop serve
    --threads 1`` builds it."""
    return make_server(load_backend(f"transformers:{model}", threads=1), port=port, model_name="tiny").start()


def train(model, url: str, out, *extra: str) -> int:
    return main(["train", "grpo", "--env", "simpop/Persuasion-v0", "--model", str(model), "--lora",
                 "--lora-r", "4", "--lora-alpha", "8", "--simulator", f"frozen:openai:{url}#tiny?max_new_tokens=4",
                 "--env-arg", "max_turns=2", "--max-new-tokens", "4", "--group-size", "2",
                 "--scenarios-per-update", "1", "--updates", str(UPDATES), "--out", str(out), "--no-progress",
                 "--no-export", "--seed", "3", "--threads", "1", *extra])


def train_records(out) -> list[dict]:
    lines = (out / "metrics.jsonl").read_text().splitlines()
    timing = ("_s", "per_s")
    return [{k: v for k, v in record.items() if not k.endswith(timing)}
            for record in map(json.loads, lines) if record["kind"] == "train"]


def test_a_killed_server_ends_the_run_in_one_line_and_resume_finishes_it_exactly(tiny_model, tmp_path, capsys,
                                                                                   monkeypatch):
    port = free_port()
    server = Served(tiny_model, port)
    try:
        assert train(tiny_model, server.url, tmp_path / "whole") == 0
        # The same run, with the server killed -9 right after update 2's checkpoint.
        save = checkpoint.save

        def save_then_kill(run_dir, step, state, keep=3):
            path = save(run_dir, step, state, keep=keep)
            if step == 2:
                server.kill()
            return path

        monkeypatch.setattr(checkpoint, "save", save_then_kill)
        capsys.readouterr()
        assert train(tiny_model, server.url, tmp_path / "cut") == 1
    finally:
        server.kill()
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and len(err) < 1200, err
    assert "a model server failed during the run" in err and "attempts" in err and "--resume" in err
    assert f"the checkpoints up to update 2 are kept in {tmp_path / 'cut'}" in err
    assert sorted(checkpoint.by_step(tmp_path / "cut")) == [1, 2]
    checkpoint.verify(checkpoint.by_step(tmp_path / "cut")[2])
    monkeypatch.setattr(checkpoint, "save", save)

    with restarted(tiny_model, port) as back:  # back on the same address: the run's spec names it
        assert train(tiny_model, back.url, tmp_path / "cut", "--resume") == 0
    resumed = train_records(tmp_path / "cut")
    assert [r["step"] for r in resumed] == list(range(1, UPDATES + 1))
    assert resumed == train_records(tmp_path / "whole")


def evaluate(model, url: str, out, tmp_path, *extra: str) -> int:
    panel = tmp_path / "panel.yaml"
    panel.write_text(f"name: served\nmembers:\n  a: frozen:openai:{url}#tiny?max_new_tokens=4\n")
    return main(["eval", "--env", "simpop/Persuasion-v0", "--env-arg", "max_turns=2", "--policy",
                 f"transformers:{model}", "--max-new-tokens", "4", "--panel", str(panel), "--episodes", "4",
                 "--concurrency", "2", "--seed", "3", "--out", str(out), "--no-progress", "--threads", "1", *extra])


def episodes(out) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_a_killed_server_stops_an_evaluation_and_resume_finishes_it_exactly(tiny_model, tmp_path, capsys,
                                                                           monkeypatch):
    from simpop.evaluation import eval_run

    port = free_port()
    server = Served(tiny_model, port)
    try:
        assert evaluate(tiny_model, server.url, tmp_path / "whole", tmp_path) == 0
        append = eval_run.append_records

        def append_then_kill(path, records):  # the server dies once the first chunk is on disk
            append(path, records)
            server.kill()

        monkeypatch.setattr(eval_run, "append_records", append_then_kill)
        capsys.readouterr()
        assert evaluate(tiny_model, server.url, tmp_path / "cut", tmp_path) == 1
    finally:
        server.kill()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("simpop eval: error: a model server failed during the run") and "--resume" in err, err
    kept = episodes(tmp_path / "cut")
    assert len(kept) == 2 and all(record["error"] is None for record in kept)  # no failure charged to the policy
    monkeypatch.setattr(eval_run, "append_records", append)

    with restarted(tiny_model, port) as back:
        assert evaluate(tiny_model, back.url, tmp_path / "cut", tmp_path, "--resume") == 0
    assert episodes(tmp_path / "cut") == episodes(tmp_path / "whole")
