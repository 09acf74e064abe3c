"""Contained subprocesses: the security boundary for code and tests written by models.

Every process the CooperBench evaluator starts (git, and above all the test runs, which execute
model-written code) goes through :func:`run`:

- **time**: a wall-clock limit; on expiry the whole process group is killed (``SIGKILL``), and
  ``RLIMIT_CPU`` bounds CPU time per process.
- **output**: stdout and stderr are read together up to ``max_output_bytes``; a process that
  writes more is killed and the result says so (a flood cannot exhaust memory).
- **memory / files**: ``RLIMIT_AS`` (address space per process) and ``RLIMIT_FSIZE`` (largest file
  written), set by a small exec wrapper (``sandbox_wrapper.py`` in this package, run by
  ``python -I -S``) rather than ``preexec_fn``, which is unsafe in threaded parents.
- **processes**: where a ``pids`` cgroup can be created (cgroup v1 or v2, as root), the run is
  put in its own cgroup with ``pids.max = max_processes``, which stops fork bombs.
- **children**: in a PID namespace (``unshare --pid --fork --kill-child``) every process the
  command leaves behind dies with it, even ones that ``setsid`` away from the process group.
  Without one, the group is killed and a scan of ``/proc`` kills any process still carrying this
  run's marker environment variable.
- **network**: with ``unshare --net`` the command runs in an empty network namespace (no
  interface is up, not even loopback). Where namespaces are not permitted, a ``sitecustomize``
  module on ``PYTHONPATH`` (``socket_guard.py``, copied) makes Python sockets
  refuse non-Unix connections: a weaker guard that only covers Python processes.
- **filesystem** (untrusted commands, namespaces permitted): a private mount namespace whose root
  is a new, minimal tree (``pivot_root`` onto a tmpfs; the host's root is detached):

  - *reads*: only the system directories (``/usr``, ``/bin``, ``/sbin``, ``/lib*``, ``/etc``
    with ``shadow``/``gshadow``/``sudoers``/``ssh``/``ssl/private`` masked), the ``PATH`` and
    ``PYTHONPATH`` entries, the prefixes of the Python interpreters found on ``PATH`` (a venv and
    its base installation), and the paths the caller lists as ``readable``, all read-only, with
    the symlinks on the way to them recreated (a venv folder that is a symlink resolves). The
    rest of the host (``/root``, ``/home``, the host's ``/tmp``, ``/var``, ``/sys``, other
    projects) is absent. ``/proc`` is a fresh, read-only procfs of the run's own PID namespace, so
    other processes' ``cmdline``/``environ`` cannot be read; ``/dev`` holds only ``null``, ``zero``,
    ``full``, ``random``, ``urandom``, ``tty``, ``pts`` and ``shm``.
  - *writes*: ``writable`` directories are overlays: the command sees their contents, but what it
    writes lands on one size-limited tmpfs (``max_disk_bytes``, shared with ``/tmp`` and
    ``/dev/shm``) and is discarded when the run ends; writing past the quota fails with "No space
    left on device" and the result says ``disk_full``. Only the files listed as ``outputs`` are
    written through to the host (each bounded by ``RLIMIT_FSIZE``). Everything else is read-only.
  - then every capability is dropped (``setpriv --bounding-set=-all --no-new-privs``), so even a
    root process cannot remount, unmount or leave the new root.

  The working directory is entered by path inside the new root. Where the private root is
  refused (e.g. mounting ``proc`` or ``pivot_root`` is not permitted; :func:`capabilities` says
  why), the older guard applies: every mount remounted read-only except the ``writable``
  directories (bind-mounted, written through, no total quota), reads not restricted. Where
  overlays are refused, ``writable`` directories are written through without a total quota (``/tmp``
  keeps its limit). Without namespaces there is no filesystem guard.

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

from simpop.validation import check_fields

#: Environment variable that tags every process of one run (the fallback child-killing mechanism).
MARKER_VAR = "SIMPOP_SANDBOX_RUN"

#: System directories visible (read-only) in the private root.
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc")
#: Paths inside the visible tree that are masked (an empty file or directory in their place).
MASKED_PATHS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers", "/etc/sudoers.d",
                "/etc/ssh", "/etc/ssl/private", "/etc/security/opasswd")
#: This package's folder: the programs a contained run starts in (sandbox_wrapper.py, socket_guard.py).
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Limits:
    """Resource limits for one contained process (and everything it starts).

    Attributes:
        timeout_s: Wall-clock limit; the whole process tree is killed when it expires.
        memory_bytes: ``RLIMIT_AS`` per process (0 disables it).
        max_file_bytes: ``RLIMIT_FSIZE``: the largest file a process may write (0 disables it).
        max_disk_bytes: Total of everything an untrusted run writes (its ``writable`` directories,
            ``/tmp``, ``/dev/shm``), the size of its scratch tmpfs where the private root is used
            (0: no total limit). Files listed as ``outputs`` are outside it (``max_file_bytes`` each).
        max_output_bytes: Combined stdout+stderr kept; writing more kills the process.
        max_processes: ``pids.max`` of the run's cgroup, where one can be created (0 disables it).
        network: Allow network access (off for everything the evaluator runs).
    """

    timeout_s: float = 60.0
    memory_bytes: int = 4 * 2**30
    max_file_bytes: int = 64 * 2**20
    max_disk_bytes: int = 256 * 2**20
    max_output_bytes: int = 2**20
    max_processes: int = 256
    network: bool = False

    def __post_init__(self) -> None:
        check_fields(self)
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_bytes < 1024:
            raise ValueError(f"max_output_bytes must be >= 1024, got {self.max_output_bytes}")
        for name in ("memory_bytes", "max_file_bytes", "max_disk_bytes", "max_processes"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0 (0 disables the limit), got {getattr(self, name)}")


@dataclass(frozen=True)
class Capabilities:
    """Which containment mechanisms this machine allows (see the module docstring).

    Attributes:
        namespaces: PID, network and mount namespaces can be created (``unshare`` as root).
        pids_cgroup: Where per-run ``pids`` cgroups are created (None: process counts are not limited).
        private_root: Untrusted runs get the private root (a minimal read-only view, their own
            ``/proc``); False: reads are not restricted and other processes are visible.
        disk_quota: ``writable`` directories are overlays on the size-limited scratch tmpfs
            (``Limits.max_disk_bytes``); False: they are written through with no total limit.
        refused: Why a stronger mechanism was refused here ("" if none was).
    """

    namespaces: bool
    pids_cgroup: Path | None
    private_root: bool = False
    disk_quota: bool = False
    refused: str = ""

    def describe(self) -> str:
        """What the sandbox enforces on this machine, in one paragraph (for logs and the env's info)."""
        if self.namespaces and self.private_root:
            text = ("network: none (empty network namespace); leftover processes: killed with the PID namespace; "
                    "filesystem: a private read-only root with only system, interpreter and run directories, "
                    "its own /proc, all capabilities dropped; disk: "
                    + ("a size-limited overlay over the writable directories" if self.disk_quota
                       else "writable directories written through, no total limit (overlays refused)"))
        elif self.namespaces:
            text = ("network: none (empty network namespace); leftover processes: killed with the PID namespace; "
                    "filesystem: read-only except the run's own directories, reads not restricted, host /proc "
                    "visible, all capabilities dropped; disk: no total limit")
        else:
            text = ("network: Python sockets blocked (sitecustomize guard); leftover processes: process group + "
                    "/proc marker scan; filesystem: not guarded; disk: no total limit")
        limit = f"a pids cgroup under {self.pids_cgroup}" if self.pids_cgroup else "not limited"
        text = f"{text}; process count: {limit}"
        return text + (f"; refused here: {self.refused}" if self.refused else "")


@functools.cache
def capabilities() -> Capabilities:
    """Probe (once) which containment mechanisms work here: the private root with overlays, then
    without overlays, then the older read-only remount; the first that runs a command is used."""
    if not (shutil.which("unshare") and shutil.which("setpriv") and sys.platform.startswith("linux")):
        return Capabilities(namespaces=False, pids_cgroup=None)
    refused: list[str] = []
    for private_root, overlay in ((True, True), (True, False), (False, False)):
        caps = Capabilities(namespaces=True, pids_cgroup=None, private_root=private_root, disk_quota=overlay)
        with tempfile.TemporaryDirectory(prefix="simpop-sandbox-probe-", ignore_cleanup_errors=True) as probe_dir:
            probe = Path(probe_dir) / "w"
            probe.mkdir()
            result = run(["sh", "-c", "echo x > probe"], probe, Limits(timeout_s=20), {"PATH": "/usr/bin:/bin"},
                         writable=[probe], _caps=caps)
        if result.exit_code == 0:
            return Capabilities(namespaces=True, pids_cgroup=_find_pids_cgroup(), private_root=private_root,
                                disk_quota=overlay, refused="; ".join(refused))
        what = "private root with overlays" if overlay else "private root" if private_root else "namespaces"
        refused.append(f"{what} ({result.describe()}: {result.tail(200).strip() or 'no output'})")
    return Capabilities(namespaces=False, pids_cgroup=None, refused="; ".join(refused))


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


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _python_prefixes(directory: str) -> list[str]:
    """Installation prefixes of the Python interpreters in ``directory`` (a venv and its base)."""
    prefixes = []
    try:
        names = [e.path for e in os.scandir(directory) if e.name.startswith("python")]
    except OSError:
        return []
    for path in names:
        for _ in range(16):  # each hop of a symlink chain (venv -> base interpreter)
            parent = os.path.dirname(os.path.abspath(path))
            if os.path.basename(parent) == "bin":
                prefix = os.path.dirname(parent)
                prefixes.append(prefix)
                with contextlib.suppress(OSError, UnicodeDecodeError):
                    for line in Path(prefix, "pyvenv.cfg").read_text().splitlines():
                        key, _, value = line.partition("=")
                        if key.strip() == "home" and value.strip():
                            prefixes.append(os.path.dirname(value.strip()))
            if not os.path.islink(path):
                break
            path = os.path.join(parent, os.readlink(path))
    return prefixes


def _symlinks_on(path: str) -> list[tuple[str, str]]:
    """Every symlink met while resolving ``path``, as (location, target as written), in the order met.

    Each location's parent is a resolved directory, so recreating these links in the private root
    (next to the resolved paths, which are mounted) makes ``path`` resolve there as it does on the
    host: a venv folder that is a symlink, a bin/python chain into another disk.
    """
    links: list[tuple[str, str]] = []
    pending, current = list(Path(path).parts[1:]), "/"
    while pending and len(links) < 64:
        name = pending.pop(0)
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        candidate = os.path.join(current, name)
        if not os.path.islink(candidate):
            current = candidate
            continue
        target = os.readlink(candidate)
        links.append((candidate, target))
        pending = list(Path(target).parts[1:] if os.path.isabs(target) else Path(target).parts) + pending
        if os.path.isabs(target):
            current = "/"
    return links


def _view(root: Path, status: Path, env: dict[str, str], writable: list[Path], readable: list[Path],
          outputs: list[Path], limits: Limits, overlay: bool) -> dict:
    """The private root's configuration for the wrapper (every path resolved, existing, host-side)."""
    writes = list(dict.fromkeys(os.path.realpath(p) for p in writable if os.path.isdir(p)))
    links, wanted = [], []
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            target = os.readlink(path)
            links.append((path, target))
            wanted.append(os.path.realpath(path))
        elif os.path.isdir(path):
            wanted.append(path)
    search = [p for var in ("PATH", "PYTHONPATH") for p in env.get(var, "").split(os.pathsep) if os.path.isabs(p)]
    wanted += search + [prefix for d in search for prefix in _python_prefixes(d)] + [str(p) for p in readable]
    reads: list[str] = []
    for path in sorted({os.path.realpath(p) for p in wanted if os.path.exists(p)}, key=lambda p: (p.count("/"), p)):
        if path != "/" and not _under(path, reads) and not _under(path, writes):
            reads.append(path)
    masked = [p for p in MASKED_PATHS if _under(p, reads) and not os.path.islink(p) and os.path.exists(p)]
    # Symlinks on the way to what is visible (outside the mounted trees, which carry their own).
    pythons = [e.path for d in search if os.path.isdir(d) for e in os.scandir(d) if e.name.startswith("python")]
    placed = {link for link, _ in links}
    for path in wanted + pythons:
        for link, target in _symlinks_on(path):
            if link not in placed and not _under(link, reads) and not _under(link, writes):
                placed.add(link)
                links.append((link, target))
    outs = list(dict.fromkeys(os.path.realpath(p) for p in outputs))
    quota = limits.max_disk_bytes
    return {"root": str(root), "status": str(status), "links": links, "readable": reads, "masked": masked,
            "writable": writes, "outputs": outs, "overlay": overlay, "quota": quota,
            "scratch_opts": f"size={quota},mode=755" if quota else "mode=755"}


def _command(argv: list[str], limits: Limits, cgroup: Path | None, writable: list[Path],
             namespaces: bool, view: dict | None = None) -> list[str]:
    """The full command line of an untrusted run: [unshare ...] wrapper config argv."""
    config = {"mem": limits.memory_bytes, "cpu": int(limits.timeout_s) + 2, "fsize": limits.max_file_bytes,
              "cgroup": str(cgroup) if cgroup else None, "guard": namespaces, "view": view if namespaces else None,
              "writable": [str(p) for p in writable], "setpriv": shutil.which("setpriv") or "setpriv"}
    command = [sys.executable, "-I", "-S", str(_HERE / "sandbox_wrapper.py"), json.dumps(config), *argv]
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
        disk_full: The run's disk quota (``Limits.max_disk_bytes``) was exhausted when it ended;
            its writes past the quota failed with "No space left on device".
        disk_used_bytes: What the run had written to its scratch tmpfs when it ended (None: no
            private root, so not measured).
        leftovers_killed: Processes the command left behind that the fallback scan had to kill.
        duration_s: Wall-clock seconds.
    """

    exit_code: int | None
    output: str
    timed_out: bool = False
    output_limited: bool = False
    disk_full: bool = False
    disk_used_bytes: int | None = None
    leftovers_killed: int = 0
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.output_limited and not self.disk_full

    def tail(self, chars: int = 2000) -> str:
        """The last ``chars`` characters of the process's output."""
        return self.output[-chars:]

    def describe(self) -> str:
        """A one-line status for logs and observations."""
        if self.timed_out:
            return f"killed after the time limit ({self.duration_s:.1f}s)"
        if self.output_limited:
            return "killed: output limit exceeded"
        if self.disk_full:
            return f"exit code {self.exit_code}; the disk quota was exhausted (writes failed: no space left)"
        return f"exit code {self.exit_code}"


def write_socket_guard(directory: Path) -> Path:
    """Write the fallback network guard into ``directory`` (put it on ``PYTHONPATH``)."""
    directory.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_HERE / "socket_guard.py", directory / "sitecustomize.py")
    return directory


def run(argv: list[str], cwd: Path, limits: Limits, env: dict[str, str] | None = None,
        writable: list[Path] | None = None, readable: list[Path] | None = None,
        outputs: list[Path] | None = None, *, _caps: Capabilities | None = None) -> ProcessResult:
    """Run ``argv`` in ``cwd`` under ``limits``; never raises for what the command does.

    Args:
        argv: The command; ``argv[0]`` is looked up on the ``PATH`` of ``env``.
        cwd: Working directory (in the private root it must be visible: writable or readable, or
            ``/tmp``).
        limits: Time, memory, output, disk, process and network limits.
        env: The complete environment for the command (nothing is inherited); a marker variable
            is added.
        writable: Makes the command *untrusted* (model-written code): every mechanism of the
            module docstring applies and these are the only directories it may write to (in the
            private root: on the size-limited overlay, discarded at the end). None (trusted
            commands, e.g. git on validated patches): only the time limit, the output cap and the
            process-group kill apply, which keeps the many git calls cheap.
        readable: Further files and directories an untrusted command may read (besides the
            system directories, its ``PATH``/``PYTHONPATH`` and their Python installations).
        outputs: Files an untrusted command writes through to the host (created empty if
            missing; each bounded by ``max_file_bytes``), e.g. a record read after the run.
    """
    caps = _caps or capabilities()
    marker = uuid.uuid4().hex
    env = {**(env or {}), MARKER_VAR: marker}
    cgroup = None
    command = list(argv)
    rundir = status = None
    if writable is not None:
        if caps.namespaces and caps.pids_cgroup is not None and limits.max_processes:
            cgroup = _make_cgroup(caps.pids_cgroup, limits.max_processes)
        view = None
        if caps.namespaces and caps.private_root:
            rundir = Path(tempfile.mkdtemp(prefix="simpop-sandbox-run-"))
            (rundir / "root").mkdir()
            status = rundir / "status"
            status.touch()
            for path in outputs or []:
                Path(path).touch()
            view = _view(rundir / "root", status, env, writable, readable or [], outputs or [], limits,
                         caps.disk_quota)
        command = _command(argv, limits, cgroup, writable, caps.namespaces, view)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        _remove_cgroup(cgroup)
        if rundir is not None:
            shutil.rmtree(rundir, ignore_errors=True)
        return ProcessResult(None, f"could not start {argv[0]!r}: {exc}")
    result = _collect(proc, limits, start)
    if not (writable is not None and caps.namespaces):
        # Without a PID namespace, children that left the process group may survive it.
        result.leftovers_killed = _kill_marked(marker)
    _remove_cgroup(cgroup)
    if rundir is not None:
        _read_status(result, status)
        shutil.rmtree(rundir, ignore_errors=True)
    result.duration_s = time.monotonic() - start
    return result


def _read_status(result: ProcessResult, status: Path | None) -> None:
    """What the private root's PID 1 reported: the command's signal and the disk quota's use."""
    try:
        report = json.loads(status.read_text()) if status else None
    except (OSError, ValueError):
        report = None
    if not isinstance(report, dict):
        return  # killed before it could report (time or output limit)
    result.disk_full = bool(report.get("disk_full"))
    result.disk_used_bytes = report.get("disk_used")
    if report.get("signal") and result.exit_code is not None:
        result.exit_code = -int(report["signal"])


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
