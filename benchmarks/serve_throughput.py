"""``simpop serve`` before and after the FastAPI/uvicorn rebuild: requests/s and latency, side by side.

Each server runs in a subprocess of its own (so the load generator does not share its interpreter) over
the same backend: ``instant`` (a scripted reply, so the numbers are the server's own overhead) or
``smollm2`` (the embedded model, where generation dominates). The old server is loaded from a checkout of
the commit before the rebuild (``--old``: a revision, checked out into a temporary worktree, or a tree)::

    python benchmarks/serve_throughput.py
    python benchmarks/serve_throughput.py --backend smollm2
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from simpop.agents.base import Generation

sys.path.insert(0, str(Path(__file__).resolve().parent))
from baseline import BEFORE, tree  # noqa: E402  (benchmarks/baseline.py)

CHAT = [{"role": "user", "content": "Say something kind."}]


class InstantBackend:
    """A reply at once: what is measured is the server around it."""

    name = "instant"

    def generate(self, chats, params):
        return [Generation(text="ok", token_ids=[1, 2], prompt_ids=[3], logprobs=None) for _ in chats]


def _child(args: argparse.Namespace) -> None:
    """Serve ``args.backend`` with the old or the new server on ``args.port`` until killed."""
    if args.serve == "old":
        spec = importlib.util.spec_from_file_location("old_serve", args.old)
        serve = sys.modules["old_serve"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(serve)
    else:
        from simpop.serve import server as serve
    if args.backend == "instant":
        backend = InstantBackend()
    else:
        import torch

        from simpop.agents import load_backend

        torch.set_num_threads(1)
        backend = load_backend(args.backend)
    server = serve.make_server(backend, port=args.port, model_name="m", batch_window_s=args.window_ms / 1000)
    print("ready", flush=True)
    server.serve_forever()


async def _load(url: str, requests: int, concurrency: int, max_tokens: int) -> tuple[float, float]:
    """Requests/s and median latency (ms) of ``requests`` chat completions over ``concurrency`` keep-alive
    connections. A minimal HTTP/1.1 client on asyncio streams: httpx's own cost per request would dominate
    an instant backend on a small machine."""
    host, port = url.removeprefix("http://").split("/")[0].split(":")
    body = json.dumps({"model": "m", "messages": CHAT, "max_tokens": max_tokens, "temperature": 0}).encode()
    request = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    latencies: list[float] = []
    remaining = requests

    async def client() -> None:
        nonlocal remaining
        reader, writer = await asyncio.open_connection(host, int(port))
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while remaining > 0:
            remaining -= 1
            start = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            assert head.startswith(b"HTTP/1.1 200"), head
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - start)
        writer.close()

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return requests / (time.perf_counter() - start), 1000 * statistics.median(latencies)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _measure(kind: str, args: argparse.Namespace, concurrency: int) -> tuple[float, float]:
    port = _free_port()
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", kind, "--port", str(port), "--old", str(args.old),
         "--backend", args.backend, "--window-ms", str(args.window_ms)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready", f"{kind} server failed"
        time.sleep(0.5)
        return asyncio.run(_load(f"http://127.0.0.1:{port}/v1", args.requests, concurrency, args.max_tokens))
    finally:
        child.terminate()
        child.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--old", default=BEFORE, help="the pre-rebuild revision or tree")
    parser.add_argument("--backend", default="instant", help="instant, or a backend spec such as smollm2")
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32], help="clients in flight (each is a run)")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--window-ms", type=float, default=10.0, help="the servers' batching window")
    parser.add_argument("--repeats", type=int, default=3, help="alternating runs per server; the best counts")
    parser.add_argument("--serve", choices=("old", "new"), help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        _child(args)
        return
    with tree(args.old) as old:
        args.old = old / "src" / "simpop" / "agents" / "serve.py"
        compare(args)


def compare(args: argparse.Namespace) -> None:
    """Old and new server, alternating, per concurrency level."""
    for concurrency in args.concurrency:
        results: dict[str, list[tuple[float, float]]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for kind in ("old", "new"):
                results[kind].append(_measure(kind, args, concurrency))
        best = {kind: max(runs) for kind, runs in results.items()}
        print(f"backend {args.backend}, {args.requests} requests, {concurrency} concurrent, "
              f"max_tokens {args.max_tokens}, best of {args.repeats}:")
        for kind, (rate, median_ms) in best.items():
            runs = ", ".join(f"{r:.1f}" for r, _ in results[kind])
            print(f"  {kind}: {rate:8.1f} requests/s (runs {runs}) | median latency {median_ms:7.1f} ms")
        print(f"  new / old throughput = {best['new'][0] / best['old'][0]:.2f}x", flush=True)


if __name__ == "__main__":
    main()
