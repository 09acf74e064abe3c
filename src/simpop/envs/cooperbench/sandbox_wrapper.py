"""The program an untrusted sandbox run starts in: ``python -I -S sandbox_wrapper.py CONFIG ARGV...``.

Started by :func:`simpop.envs.cooperbench.sandbox.run` (as PID 1 of the namespaces when they are used), it joins
the run's pids cgroup, sets the resource limits, builds the filesystem view (a private root, or the older read-only
remount), then runs ``ARGV`` through ``setpriv`` with every capability dropped. ``-I -S`` keep it independent of
the environment and fast (~30 ms): it imports json (and so re), os, resource, sys, and ctypes only for a guard.
"""

import json
import os
import re
import resource
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 8, 32, 4096, 16384


class Kernel:
    """mount(2), umount2(2) and pivot_root(2) through libc (ctypes is imported here, where a guard is built)."""

    def __init__(self) -> None:
        import ctypes

        self.libc, self._errno, self._ulong = ctypes.CDLL(None, use_errno=True), ctypes.get_errno, ctypes.c_ulong

    def _error(self, what: str, path: str) -> OSError:
        err = self._errno()
        return OSError(err, what + os.strerror(err), path)

    def mount(self, source: str | None, target: str, fstype: str | None = None, flags: int = 0,
              data: str | None = None) -> None:
        """mount(2); raises ``OSError`` naming ``target``."""
        args = [None if s is None else s.encode() for s in (source, target, fstype)]
        if self.libc.mount(*args, self._ulong(flags), None if data is None else data.encode()) != 0:
            raise self._error("", target)

    def pivot_root(self, new_root: str) -> None:
        """Enter ``new_root`` and make it the root, the old one on ``/.oldroot`` (the raw system call)."""
        os.chdir(new_root)
        if self.libc.syscall(155 if os.uname().machine == "x86_64" else 41, b".", b".oldroot") != 0:
            raise self._error("pivot_root: ", new_root)

    def read_only(self, points: list[str], keep: list[str]) -> None:
        """Remount ``points`` read-only, except ``keep``."""
        for point in points:
            if point not in keep:
                try:
                    self.mount(None, point, None, MS_REMOUNT | MS_BIND | MS_RDONLY)
                except OSError:
                    pass  # already read-only, or not remountable (pseudo filesystems)


def mountpoints() -> list[str]:
    """Every mount point of this namespace, once each, in mount order."""
    with open("/proc/self/mounts") as f:
        return list(dict.fromkeys(re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), line.split()[1])
                                  for line in f))


def remount_read_only(kernel: Kernel, writable: list[str]) -> None:
    """The older guard: the host tree, every mount read-only except the writable directories."""
    keep = [os.path.realpath(p) for p in writable]
    for path in keep:
        kernel.mount(path, path, None, MS_BIND)
    kernel.read_only(mountpoints(), keep)
    # The working directory was entered before the bind mounts above: re-enter it by path, or it
    # stays on the read-only mount underneath and relative writes fail.
    cwd = os.getcwd()
    os.chdir("/")
    os.chdir(cwd)


def private_root(kernel: Kernel, view: dict) -> tuple[int, int]:
    """Pivot into a new, minimal, read-only root; returns the status file's and the scratch tmpfs's descriptors."""
    cwd = os.getcwd()
    status = os.open(view["status"], os.O_WRONLY | os.O_TRUNC)
    new = view["root"]
    kernel.mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=755")
    scratch = new + "/.scratch"
    os.mkdir(scratch)
    kernel.mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, view["scratch_opts"])
    for name in ("tmp", "shm", "upper", "work"):
        os.mkdir(f"{scratch}/{name}")
    os.chmod(f"{scratch}/tmp", 0o1777)
    os.chmod(f"{scratch}/shm", 0o1777)

    def place(path: str, is_dir: bool) -> str:
        dst = new + path
        if is_dir:
            os.makedirs(dst, exist_ok=True)
        else:
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            if not os.path.lexists(dst):
                open(dst, "w").close()
        return dst

    keep = [scratch]
    keep.append(place("/tmp", True))
    kernel.mount(scratch + "/tmp", keep[-1], None, MS_BIND)
    for link, target in view["links"]:
        os.makedirs(os.path.dirname(new + link), exist_ok=True)
        os.symlink(target, new + link)
    for path in view["readable"]:
        kernel.mount(path, place(path, os.path.isdir(path)), None, MS_BIND | MS_REC)
    empty = new + "/.empty"
    open(empty, "w").close()
    for path in view["masked"]:
        if os.path.isdir(path):
            kernel.mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "size=4k,mode=755")
        else:
            kernel.mount(empty, new + path, None, MS_BIND)
    for i, path in enumerate(view["writable"]):
        dst = place(path, True)
        if view["overlay"]:
            upper, work = f"{scratch}/upper/{i}", f"{scratch}/work/{i}"
            os.mkdir(upper)
            os.mkdir(work)
            esc = [p.replace("\\", "\\\\").replace(",", "\\,").replace(":", "\\:") for p in (path, upper, work)]
            kernel.mount("overlay", dst, "overlay", MS_NOSUID | MS_NODEV,
                         f"lowerdir={esc[0]},upperdir={esc[1]},workdir={esc[2]}")
        else:
            kernel.mount(path, dst, None, MS_BIND)
        keep.append(dst)
    for path in view["outputs"]:
        keep.append(place(path, False))
        kernel.mount(path, keep[-1], None, MS_BIND)
    kernel.mount("proc", place("/proc", True), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_RDONLY)
    place("/sys", True)
    dev = place("/dev", True)
    kernel.mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=64k,mode=755")
    for node in ("null", "zero", "full", "random", "urandom", "tty"):
        if os.path.exists("/dev/" + node):
            open(f"{dev}/{node}", "w").close()
            kernel.mount("/dev/" + node, f"{dev}/{node}", None, MS_BIND)
            keep.append(f"{dev}/{node}")
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(target, f"{dev}/{name}")
    os.mkdir(f"{dev}/shm")
    kernel.mount(scratch + "/shm", f"{dev}/shm", None, MS_BIND)
    keep.append(f"{dev}/shm")
    os.mkdir(f"{dev}/pts")
    try:
        kernel.mount("devpts", f"{dev}/pts", "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=620")
        keep.append(f"{dev}/pts")
    except OSError:
        pass  # no pseudo-terminals in the sandbox
    os.mkdir(new + "/.oldroot")
    kernel.read_only([p for p in mountpoints() if p.startswith(new + "/")], keep)
    kernel.pivot_root(new)
    os.chdir("/")
    kernel.libc.umount2(b"/.oldroot", 2)  # MNT_DETACH: the host's tree is gone from this namespace
    os.rmdir("/.oldroot")
    quota = os.open("/.scratch", os.O_RDONLY | os.O_DIRECTORY)
    kernel.libc.umount2(b"/.scratch", 2)
    os.rmdir("/.scratch")
    os.unlink("/.empty")
    kernel.mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY)
    try:
        os.chdir(cwd)
    except OSError:
        print(f"simpop sandbox: the working directory {cwd} is not in the sandbox's view", file=sys.stderr)
        os._exit(126)
    return status, quota


def run_as_init(argv: list[str], view: dict, status: int, quota: int) -> None:
    """PID 1 of the private root: run the command, then report its status and the disk quota's use."""
    pid = os.fork()
    if pid == 0:
        try:
            os.execvp(argv[0], argv)
        except OSError as exc:
            print(f"simpop sandbox: could not start {argv[5]!r}: {exc}", file=sys.stderr)
        os._exit(127)
    while True:
        try:
            done, code = os.wait()
        except ChildProcessError:
            code = 127 << 8
            break
        if done == pid:
            break
    st = os.fstatvfs(quota)
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    signum = os.WTERMSIG(code) if os.WIFSIGNALED(code) else 0
    os.write(status, json.dumps({"signal": signum, "disk_used": total - free,
                                 "disk_full": view["quota"] > 0 and free < max(2**20, total // 100)}).encode())
    os._exit(128 + signum if signum else os.WEXITSTATUS(code))


def main(cfg: dict, argv: list[str]) -> None:
    """Contain this process as ``cfg`` says (see :func:`simpop.envs.cooperbench.sandbox.run`), then run ``argv``."""
    os.get_exec_path()  # imports what execvp needs while the interpreter's own files are still at hand
    if cfg["cgroup"]:
        with open(os.path.join(cfg["cgroup"], "cgroup.procs"), "w") as f:
            f.write("0")
    for res, val in ((resource.RLIMIT_AS, cfg["mem"]), (resource.RLIMIT_CPU, cfg["cpu"]),
                     (resource.RLIMIT_FSIZE, cfg["fsize"])):
        if val > 0:
            resource.setrlimit(res, (val, val))
    if not cfg["guard"]:
        os.execvp(argv[0], argv)
    view = cfg["view"]
    command = [cfg["setpriv"], "--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--", *argv]
    if view is None:
        remount_read_only(Kernel(), cfg["writable"])
        os.execvp(command[0], command)
    status, quota = private_root(Kernel(), view)
    run_as_init(command, view, status, quota)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]), sys.argv[2:])
