"""Contained subprocesses: the security boundary for code and tests written by models.

Every process the CooperBench evaluator starts (git, and above all the test runs, which execute
model-written code) goes through :func:`run`:

- **time**: a wall-clock limit; on expiry the whole process group is killed (``SIGKILL``), and
  ``RLIMIT_CPU`` bounds CPU time per process.
- **output**: stdout and stderr are read together up to ``max_output_bytes``; a process that
  writes more is killed and the result says so (a flood cannot exhaust memory).
- **memory / files**: ``RLIMIT_AS`` (address space per process) and ``RLIMIT_FSIZE`` (largest file
  written), set by a small exec wrapper (``python -I -S -c ...``) rather than ``preexec_fn``,
  which is unsafe in threaded parents.
- **processes**: where a ``pids`` cgroup can be created (cgroup v1 or v2, as root), the run is
  put in its own cgroup with ``pids.max = max_processes``, which stops fork bombs.
- **children**: in a PID namespace (``unshare --pid --fork --kill-child``) every process the
  command leaves behind dies with it, even ones that ``setsid`` away from the process group.
  Without one, the group is killed and a scan of ``/proc`` kills any process still carrying this
  run's marker environment variable.
- **network**: with ``unshare --net`` the command runs in an empty network namespace (no
  interface is up, not even loopback). Where namespaces are not permitted, a ``sitecustomize``
  module on ``PYTHONPATH`` makes Python sockets refuse non-Unix connections: a weaker guard that
  only covers Python processes.
- **filesystem** (untrusted commands, namespaces permitted): a private mount namespace in which
  every mount is remounted read-only except the directories the command is given; then every
  capability is dropped (``setpriv --bounding-set=-all --no-new-privs``), so even a root process
  cannot remount, and writes anywhere else fail with "Read-only file system". The working
  directory is re-entered after the mounts, so relative paths reach the writable bind mount.
  Reads are not restricted. Without namespaces there is no filesystem guard.

Namespaces need root (or unprivileged user namespaces, which are not used here).
:func:`capabilities` probes once which mechanisms this machine allows.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

#: Environment variable that tags every process of one run (the fallback child-killing mechanism).
MARKER_VAR = "SIMPOP_SANDBOX_RUN"

# Runs in the child before an untrusted command (as PID 1 of the namespaces when they are used):
# join the run's pids cgroup, set the resource limits, make every mount read-only except the
# writable directories, then exec the command through setpriv with every capability dropped.
# `-I -S` keeps it independent of the environment and fast (~30 ms with ctypes).
_WRAPPER = r"""
import json, os, resource, sys
cfg, argv = json.loads(sys.argv[1]), sys.argv[2:]
if cfg["cgroup"]:
    with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
        f.write("0")
for res, val in ((resource.RLIMIT_AS, cfg["mem"]), (resource.RLIMIT_CPU, cfg["cpu"]),
                 (resource.RLIMIT_FSIZE, cfg["fsize"])):
    if val > 0:
        resource.setrlimit(res, (val, val))
if cfg["guard"]:
    import ctypes, re
    libc = ctypes.CDLL(None, use_errno=True)
    MS_RDONLY, MS_REMOUNT, MS_BIND = 1, 32, 4096
    def mount(source, target, flags):
        if libc.mount(source, target.encode(), None, flags, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), target)
    keep = [os.path.realpath(p) for p in cfg["writable"]]
    for path in keep:
        mount(path.encode(), path, MS_BIND)
    with open("/proc/self/mounts") as f:
        points = [re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1]) for line in f]
    for point in dict.fromkeys(points):
        if point not in keep:
            try:
                mount(None, point, MS_REMOUNT | MS_BIND | MS_RDONLY)
            except OSError:
                pass  # already read-only, or not remountable (pseudo filesystems)
    # The working directory was entered before the bind mounts above: re-enter it by path, or it
    # stays on the read-only mount underneath and relative writes fail.
    cwd = os.getcwd()
    os.chdir("/")
    os.chdir(cwd)
    argv = [cfg["setpriv"], "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--", *argv]
os.get_exec_path()  # imports what execvp needs while the interpreter's own files are still at hand
os.execvp(argv[0], argv)
"""

# Imported by every Python process started with the fallback network guard on PYTHONPATH.
_SOCKET_GUARD = '''"""simpop sandbox: no network for this process (fallback when network namespaces are unavailable)."""
import socket

_connect, _connect_ex, _sendto = socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto


def _check(sock):
    if sock.family != getattr(socket, "AF_UNIX", None):
        raise PermissionError("network access is disabled in the simpop sandbox")


def connect(self, *a):
    _check(self)
    return _connect(self, *a)


def connect_ex(self, *a):
    _check(self)
    return _connect_ex(self, *a)


def sendto(self, *a):
    _check(self)
    return _sendto(self, *a)


socket.socket.connect, socket.socket.connect_ex, socket.socket.sendto = connect, connect_ex, sendto
'''


@dataclass(frozen=True)
class Limits:
    """Resource limits for one contained process (and everything it starts).

    Attributes:
        timeout_s: Wall-clock limit; the whole process tree is killed when it expires.
        memory_bytes: ``RLIMIT_AS`` per process (0 disables it).
        max_file_bytes: ``RLIMIT_FSIZE``: the largest file a process may write (0 disables it).
        max_output_bytes: Combined stdout+stderr kept; writing more kills the process.
        max_processes: ``pids.max`` of the run's cgroup, where one can be created (0 disables it).
        network: Allow network access (off for everything the evaluator runs).
    """

    timeout_s: float = 60.0
    memory_bytes: int = 4 * 2**30
    max_file_bytes: int = 64 * 2**20
    max_output_bytes: int = 2**20
    max_processes: int = 256
    network: bool = False

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_bytes < 1024:
            raise ValueError(f"max_output_bytes must be >= 1024, got {self.max_output_bytes}")
        for name in ("memory_bytes", "max_file_bytes", "max_processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 disables the limit), got {getattr(self, name)}")


@dataclass(frozen=True)
class Capabilities:
    """Which containment mechanisms this machine allows (see the module docstring).

    Attributes:
        namespaces: PID, network and mount namespaces can be created (``unshare`` as root).
        pids_cgroup: Where per-run ``pids`` cgroups are created (None: process counts are not limited).
    """

    namespaces: bool
    pids_cgroup: Path | None

    def describe(self) -> str:
        if self.namespaces:
            text = ("network: none (empty network namespace); leftover processes: killed with the PID namespace; "
                    "filesystem: read-only except the run's own directories, all capabilities dropped")
        else:
            text = ("network: Python sockets blocked (sitecustomize guard); leftover processes: process group + "
                    "/proc marker scan; filesystem: not guarded")
        limit = f"a pids cgroup under {self.pids_cgroup}" if self.pids_cgroup else "not limited"
        return f"{text}; process count: {limit}"


@functools.cache
def capabilities() -> Capabilities:
    """Probe (once) which containment mechanisms work here."""
    namespaces = False
    if shutil.which("unshare") and shutil.which("setpriv") and sys.platform.startswith("linux"):
        with _scratch_dir() as probe_dir:
            command = _command(["true"], Limits(), None, [Path(probe_dir)], namespaces=True)
            try:
                namespaces = subprocess.run(command, capture_output=True, timeout=20).returncode == 0
            except (OSError, subprocess.SubprocessError):
                namespaces = False
    return Capabilities(namespaces=namespaces, pids_cgroup=_find_pids_cgroup() if namespaces else None)


def _find_pids_cgroup() -> Path | None:
    """A cgroup directory under which this process may create children with ``pids.max``."""
    candidates = [Path("/sys/fs/cgroup/pids")]
    for root in (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup")):
        controllers = root / "cgroup.controllers"
        if controllers.is_file() and "pids" in controllers.read_text().split():
            candidates.append(root)
    for root in candidates:
        probe = root / f"simpop-probe-{uuid.uuid4().hex[:8]}"
        try:
            probe.mkdir()
        except OSError:
            continue
        try:
            (probe / "pids.max").write_text("8")
            return root
        except OSError:
            continue
        finally:
            with contextlib.suppress(OSError):
                probe.rmdir()
    return None


@contextlib.contextmanager
def _scratch_dir():
    path = tempfile.mkdtemp(prefix="simpop-sandbox-probe-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _command(argv: list[str], limits: Limits, cgroup: Path | None, writable: list[Path],
             namespaces: bool) -> list[str]:
    """The full command line of an untrusted run: [unshare ...] wrapper config argv."""
    config = {"mem": limits.memory_bytes, "cpu": int(limits.timeout_s) + 2, "fsize": limits.max_file_bytes,
              "cgroup": str(cgroup) if cgroup else None, "guard": namespaces,
              "writable": [str(p) for p in writable], "setpriv": shutil.which("setpriv") or "setpriv"}
    command = [sys.executable, "-I", "-S", "-c", _WRAPPER, json.dumps(config), *argv]
    if not namespaces:
        return command
    flags = ["--mount", "--propagation", "private", "--pid", "--fork", "--kill-child"]
    if not limits.network:
        flags.append("--net")
    return [shutil.which("unshare") or "unshare", *flags, "--", *command]


@dataclass
class ProcessResult:
    """What a contained process did.

    Attributes:
        exit_code: The exit status (negative: killed by that signal); None if it never started.
        output: stdout and stderr interleaved, decoded (replacement characters for bad bytes).
        timed_out: The wall-clock limit expired and the process tree was killed.
        output_limited: The output cap was hit and the process tree was killed.
        leftovers_killed: Processes the command left behind that the fallback scan had to kill.
        duration_s: Wall-clock seconds.
    """

    exit_code: int | None
    output: str
    timed_out: bool = False
    output_limited: bool = False
    leftovers_killed: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited

    def tail(self, chars: int = 2000) -> str:
        return self.output[-chars:]

    def describe(self) -> str:
        """A one-line status for logs and observations."""
        if self.timed_out:
            return f"killed after the time limit ({self.duration_s:.1f}s)"
        if self.output_limited:
            return "killed: output limit exceeded"
        return f"exit code {self.exit_code}"


def write_socket_guard(directory: Path) -> Path:
    """Write the fallback network guard into ``directory`` (put it on ``PYTHONPATH``)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(_SOCKET_GUARD)
    return directory


def run(argv: list[str], cwd: Path, limits: Limits, env: dict[str, str] | None = None,
        writable: list[Path] | None = None) -> ProcessResult:
    """Run ``argv`` in ``cwd`` under ``limits``; never raises for what the command does.

    Args:
        argv: The command; ``argv[0]`` is looked up on the ``PATH`` of ``env``.
        cwd: Working directory.
        limits: Time, memory, output, process and network limits.
        env: The complete environment for the command (nothing is inherited); a marker variable
            is added.
        writable: Makes the command *untrusted* (model-written code): every mechanism of the
            module docstring applies and these are the only directories it may write to. None
            (trusted commands, e.g. git on validated patches): only the time limit, the output
            cap and the process-group kill apply, which keeps the many git calls cheap.
    """
    caps = capabilities()
    marker = uuid.uuid4().hex
    env = {**(env or {}), MARKER_VAR: marker}
    cgroup = None
    command = list(argv)
    if writable is not None:
        if caps.namespaces and caps.pids_cgroup is not None and limits.max_processes:
            cgroup = _make_cgroup(caps.pids_cgroup, limits.max_processes)
        command = _command(argv, limits, cgroup, writable, caps.namespaces)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        _remove_cgroup(cgroup)
        return ProcessResult(None, f"could not start {argv[0]!r}: {exc}")
    result = _collect(proc, limits, start)
    if not (writable is not None and caps.namespaces):
        # Without a PID namespace, children that left the process group may survive it.
        result.leftovers_killed = _kill_marked(marker)
    _remove_cgroup(cgroup)
    result.duration_s = time.monotonic() - start
    return result


def _make_cgroup(root: Path, max_processes: int) -> Path | None:
    path = root / f"simpop-{uuid.uuid4().hex[:12]}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(max_processes))
    except OSError:
        _remove_cgroup(path)
        return None
    return path


def _remove_cgroup(path: Path | None) -> None:
    """Remove a run's cgroup once its processes are gone (they are dying when this is called)."""
    if path is None:
        return
    for _ in range(50):
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            time.sleep(0.02)


def _collect(proc: subprocess.Popen, limits: Limits, start: float) -> ProcessResult:
    """Read output until the process exits, the deadline passes or the output cap is hit."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks: list[bytes] = []
    size = 0
    timed_out = output_limited = False
    deadline = start + limits.timeout_s
    exited_at: float | None = None
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
                # The command is done: whatever it left behind goes now (and closes the pipe).
                _kill_group(proc)
            if exited_at is not None and now - exited_at > 1.0:
                break  # a leftover still holds the pipe open; the marker scan gets it
            if now >= deadline:
                timed_out = exited_at is None
                break
            if not selector.select(timeout=min(0.1, deadline - now)):
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                if exited_at is not None or proc.poll() is not None:
                    break
                time.sleep(0.01)  # EOF but the process lives on with its output closed
                continue
            chunks.append(data[: limits.max_output_bytes - size])
            size += len(data)
            if size > limits.max_output_bytes:
                output_limited = True
                break
    _kill_group(proc)
    proc.wait()
    proc.stdout.close()
    output = b"".join(chunks).decode("utf-8", errors="replace")
    return ProcessResult(None if timed_out or output_limited else proc.returncode, output,
                         timed_out=timed_out, output_limited=output_limited)


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _kill_marked(marker: str) -> int:
    """Kill processes whose environment carries ``marker`` (escapees of the process group)."""
    needle = f"{MARKER_VAR}={marker}".encode()
    killed = 0
    proc_dir = Path("/proc")
    if not proc_dir.is_dir():
        return 0
    for entry in proc_dir.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                os.kill(int(entry.name), signal.SIGKILL)
                killed += 1
        except (OSError, ValueError):
            continue
    return killed
