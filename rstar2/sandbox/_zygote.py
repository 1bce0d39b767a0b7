"""Fork server ("zygote") for model-written code; runs inside the sandbox, stdlib only, no rstar2 imports.

Started by :mod:`rstar2.sandbox.pool` as ``python -I _zygote.py '<json config>'`` (inside bubblewrap when
available). It imports the math stack once, then serves JSON-line requests on stdin and answers JSON lines on
the original stdout. Per request it forks one child that: starts its own session and process group; gets
rlimits (CPU, address space, processes, file size, open files, no core); works in a private empty directory;
drops to a per-slot unprivileged uid when the zygote is root; reads stdin from the request; writes
stdout/stderr to pipes; runs the code in fresh globals and, when nothing was printed, prints the repr of the
last expression (IPython-style, paper §2.1). The zygote enforces the wall-clock timeout and the output cap by
SIGKILLing the child's process group, then sweeps every process of the slot (escaped daemons) before the slot
is reused. Config keys: preload (module names), warmup (code run once after the preloads), slots, uid_base (int or
null), workdir, sweep ("uid" | "pidns" | "none"), private_tmp (a mount namespace per call whose /tmp is the
job directory), keep / mkdirs / cover (Python trees bound again in it: rstar2/sandbox/python_layout.py), env
(dict for the children).
"""

import ctypes
import json
import os
import resource
import selectors
import signal
import sys
import time

CFG = json.loads(sys.argv[1])
for k, v in CFG.get("env", {}).items():  # before the preloads: OPENBLAS_NUM_THREADS etc. are read at import
    os.environ[k] = v

PRELOADED = []
for _name in CFG.get("preload", []):
    try:
        __import__(_name)
        PRELOADED.append(_name)
    except Exception:  # a missing optional library must not stop the service
        pass
if CFG.get("warmup"):
    try:
        exec(compile(CFG["warmup"], "<warmup>", "exec"), {"__name__": "__warmup__"})
    except Exception:
        pass
if "matplotlib" in sys.modules:
    import matplotlib
    matplotlib.use("Agg")

import ast  # noqa: E402
import builtins  # noqa: E402
import gc  # noqa: E402
import io  # noqa: E402
import random  # noqa: E402
import traceback  # noqa: E402

_LIBC = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS, _PR_SET_CHILD_SUBREAPER = 1, 38, 36
_CLONE_NEWNS, _MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x00020000, 2, 4, 4096, 16384, 1 << 18
MB = 1024 * 1024
SLOTS = int(CFG.get("slots", 16))
UID_BASE = CFG.get("uid_base")
WORKDIR = CFG.get("workdir", "/tmp")
SWEEP = CFG.get("sweep", "none")
READ_CHUNK = 65536
PRIVATE_TMP = bool(CFG.get("private_tmp"))  # each call sees its own job directory as /tmp
# Python trees (path, is_dir) that the private /tmp or a cover hides, bound again per call (one missing here is
# left out: the pool's start-up probe names it); their mount points' parents; directories a call's uid
# cannot enter (a 0700 home, uid mode), covered by an empty tmpfs per call.
KEEP = [(p, is_dir) for p, is_dir in CFG.get("keep", []) if os.path.exists(p)]
MKDIRS, COVER = CFG.get("mkdirs", []), CFG.get("cover", [])


class _CountingFile(io.FileIO):
    """fd 1 for the snippet: counts bytes so the last-expression repr is shown only when nothing was printed."""
    written = 0

    def write(self, b):
        n = super().write(b)
        self.written += n or 0
        return n


def _run_snippet(code: str) -> int:
    """Runs in the forked child. Returns the exit code (0 ok, 1 uncaught exception, or the sys.exit code)."""
    out_raw = _CountingFile(1, "w", closefd=False)
    # line-buffered: what a call printed before it was killed (timeout, output cap) still comes back
    sys.stdout = io.TextIOWrapper(io.BufferedWriter(out_raw), encoding="utf-8", errors="backslashreplace",
                                  line_buffering=True)
    sys.stderr = io.TextIOWrapper(io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding="utf-8",
                                  errors="backslashreplace", line_buffering=True)
    sys.stdin = io.TextIOWrapper(io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding="utf-8",
                                 errors="replace")
    sys.__stdout__, sys.__stderr__, sys.__stdin__ = sys.stdout, sys.stderr, sys.stdin
    sys.argv = [""]
    code_rc = 0
    try:
        tree = ast.parse(code, "<code>")
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = ast.Expression(tree.body.pop().value)
        g = {"__name__": "__main__", "__builtins__": builtins}
        exec(compile(tree, "<code>", "exec"), g)
        if last is not None:
            value = eval(compile(last, "<code>", "eval"), g)
            sys.stdout.flush()
            if value is not None and out_raw.written == 0:
                print(repr(value))
    except SystemExit as e:
        if e.code is None:
            code_rc = 0
        elif isinstance(e.code, int):
            code_rc = e.code & 0xFF
        else:
            print(e.code, file=sys.stderr)
            code_rc = 1
    except BaseException:
        etype, evalue, tb = sys.exc_info()
        try:
            traceback.print_exception(etype, evalue, tb.tb_next if tb is not None else None)
        except BaseException:
            pass
        code_rc = 1
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except BaseException:
            pass
    return code_rc


def _mount(src, target, fstype=None, flags=_MS_BIND | _MS_REC, data=None) -> None:
    if _LIBC.mount(src.encode(), target.encode(), fstype, flags, data) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {src} on {target}: {os.strerror(err)}")


def _private_tmp(jobdir: str) -> None:
    """A mount namespace per call (~0.25 ms): /tmp is the job directory, nobody else's; COVER gets empty
    tmpfs; the Python trees these hide are bound again (~0.1 ms each) from O_PATH descriptors taken before
    (a bind's source must be in the caller's own mount namespace), on root-owned 0755 mount points."""
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "private /tmp for the call: unshare")
    _mount("none", "/", flags=_MS_REC | _MS_PRIVATE)
    held = [(path, is_dir, os.open(path, os.O_PATH)) for path, is_dir in KEEP]
    _mount(jobdir, "/tmp", flags=_MS_BIND)
    for d in COVER:
        _mount("tmpfs", d, b"tmpfs", _MS_NOSUID | _MS_NODEV, b"mode=755,size=1m")
    for d in MKDIRS:
        os.mkdir(d)
        os.chmod(d, 0o755)  # whatever the umask: the call's uid must pass through
    for path, is_dir, fd in held:
        os.mkdir(path) if is_dir else os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o644))
        _mount(f"/proc/self/fd/{fd}", path)
        os.close(fd)


def _child(req: dict, slot: int, fd_in: int, out_w: int, err_w: int, jobdir: str) -> None:
    """The forked child: isolate, limit, then run the snippet. Never returns."""
    rc = 1
    try:
        os.setsid()
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGPIPE, signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        os.chmod(jobdir, 0o700 if UID_BASE is not None else 0o755)
        os.dup2(fd_in, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.closerange(3, 65536)
        if PRIVATE_TMP:
            _private_tmp(jobdir)
            jobdir = "/tmp"
        os.chdir(jobdir)
        os.environ.update({"HOME": jobdir, "TMPDIR": jobdir, "MPLCONFIGDIR": jobdir})
        with open("/proc/self/statm") as f:  # the fork already carries the preloaded libraries' mappings
            base_vm = int(f.read().split()[0]) * resource.getpagesize()
        mem = base_vm + int(req["memory_mb"]) * MB
        cpu = max(1, int(req["cpu_s"]))
        fsize = int(req["max_file_mb"]) * MB
        for lim, val in ((resource.RLIMIT_CPU, (cpu, cpu + 1)), (resource.RLIMIT_AS, (mem, mem)),
                         (resource.RLIMIT_FSIZE, (fsize, fsize)), (resource.RLIMIT_NOFILE, (256, 256)),
                         (resource.RLIMIT_CORE, (0, 0)),
                         (resource.RLIMIT_NPROC, (int(req["max_processes"]),) * 2)):
            resource.setrlimit(lim, val)
        if UID_BASE is not None:
            uid = int(UID_BASE) + slot
            os.setgroups([])
            os.setresgid(uid, uid, uid)
            os.setresuid(uid, uid, uid)
        _LIBC.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
        random.seed()  # a fork copies the zygote's generator state: reseed so calls do not share "random" draws
        if "numpy.random" in sys.modules:  # not yet imported: its first import seeds from the OS, and
            sys.modules["numpy.random"].seed()  # touching numpy.random would import it (~15 ms) in every call
        gc.enable()
        rc = _run_snippet(req["code"])
    except BaseException:
        try:
            os.write(2, ("sandbox setup failed: " + traceback.format_exc()).encode())
        except BaseException:
            pass
    os._exit(rc)


class Job:
    __slots__ = ("req", "pid", "slot", "start", "deadline", "out", "err", "open", "cap", "status", "rc", "jobdir")


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _sweep(job: Job, live_sids: set) -> None:
    """Kill processes the job left behind outside its process group (setsid daemons)."""
    if SWEEP == "none":
        return
    me = os.getpid()
    uid = None if UID_BASE is None else int(UID_BASE) + job.slot
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in (me, 1):
            continue
        try:
            if SWEEP == "uid":
                if os.stat(f"/proc/{name}").st_uid != uid:
                    continue
            elif os.getsid(pid) in live_sids or os.getsid(pid) == os.getsid(0):
                continue  # "pidns": everything in our namespace that is not a live job or the zygote
            os.kill(pid, signal.SIGKILL)
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass


def _rmtree(path: str) -> None:
    for root, dirs, files in os.walk(path, topdown=False):
        for n in files:
            try:
                os.unlink(os.path.join(root, n))
            except OSError:
                pass
        for n in dirs:
            try:
                p = os.path.join(root, n)
                os.unlink(p) if os.path.islink(p) else os.rmdir(p)
            except OSError:
                pass


def main() -> None:
    proto_out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)  # nothing (a stray print, a library warning) may corrupt the protocol stream
    _LIBC.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of snippets come back to us to be reaped
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    os.makedirs(WORKDIR, exist_ok=True)
    gc.collect()
    gc.freeze()  # keep the preloaded heap out of the children's collections: fewer copy-on-write faults
    sel = selectors.DefaultSelector()
    stdin_fd = sys.stdin.fileno()
    os.set_blocking(stdin_fd, False)
    sel.register(stdin_fd, selectors.EVENT_READ, None)
    wake_r, wake_w = os.pipe()  # SIGCHLD wakes select at once instead of after its poll interval
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    sel.register(wake_r, selectors.EVENT_READ, "wake")
    inbuf = b""
    queue: list = []
    jobs: dict = {}  # pid -> Job
    free = list(range(SLOTS))
    proto_out.write(json.dumps({"ready": True, "preloaded": PRELOADED, "pid": os.getpid()}) + "\n")
    proto_out.flush()
    eof = False

    def start(req):
        """Fork the call's child; a setup failure (no space for its directory, ...) fails this call only."""
        slot = free.pop()
        jobdir = os.path.join(WORKDIR, f"job{slot}")
        fds = []
        try:
            _rmtree(jobdir)
            os.makedirs(jobdir, mode=0o700, exist_ok=True)
            if UID_BASE is not None:
                uid = int(UID_BASE) + slot
                os.chown(jobdir, uid, uid)
            # stdin lives in memory (a memfd), not in the shared /tmp a neighbour may have filled; a lone
            # surrogate (valid JSON, not encodable) becomes U+FFFD instead of an exception
            fd_in = os.memfd_create("stdin")
            fds.append(fd_in)
            data = (req.get("stdin") or "").encode("utf-8", errors="replace")
            view = memoryview(data)
            while view:
                view = view[os.write(fd_in, view):]
            os.lseek(fd_in, 0, os.SEEK_SET)
            out_r, out_w = os.pipe()
            fds += [out_r, out_w]
            err_r, err_w = os.pipe()
            fds += [err_r, err_w]
            pid = os.fork()
        except Exception as e:
            for fd in fds:
                os.close(fd)
            free.append(slot)
            _answer({"id": req.get("id"), "status": "error", "exit_code": None, "stdout": "",
                     "stderr": f"sandbox setup failed: {type(e).__name__}: {e}", "duration_s": 0.0})
            return
        if pid == 0:
            _child(req, slot, fd_in, out_w, err_w, jobdir)
        for fd in (fd_in, out_w, err_w):
            os.close(fd)
        job = Job()
        job.req, job.pid, job.slot, job.jobdir = req, pid, slot, jobdir
        job.start = time.monotonic()
        job.deadline = job.start + float(req["timeout_s"])
        job.out, job.err, job.open = bytearray(), bytearray(), 2
        job.cap, job.status, job.rc = int(req["max_output_bytes"]), None, None
        for fd, which in ((out_r, "out"), (err_r, "err")):
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ, (job, which))
        jobs[pid] = job

    def _answer(res):
        proto_out.write(json.dumps(res) + "\n")
        proto_out.flush()

    def finish(job):
        _kill_group(job.pid)
        _sweep(job, {j.pid for j in jobs.values() if j is not job})
        for key in list(sel.get_map().values()):
            if isinstance(key.data, tuple) and key.data[0] is job:
                try:
                    while True:  # drain what is already buffered, still within the cap
                        chunk = os.read(key.fd, READ_CHUNK)
                        if not chunk:
                            break
                        _take(job, key.data[1], chunk)
                except (BlockingIOError, OSError):
                    pass
                sel.unregister(key.fd)
                os.close(key.fd)
        rc = job.rc
        stdout = job.out.decode("utf-8", errors="replace")
        stderr = job.err.decode("utf-8", errors="replace")
        status = job.status
        if status is None:
            last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
            if rc in (-signal.SIGXCPU, -signal.SIGKILL):
                status = "timeout"
            elif rc == -signal.SIGXFSZ or last.startswith("OSError: [Errno 27]"):  # RLIMIT_FSIZE
                status = "output-limit"
            elif last.split(":", 1)[0].endswith("MemoryError") or \
                    "sandbox setup failed: " in stderr and "MemoryError" in last:  # incl. numpy's _ArrayMemoryError
                status = "memory"
            else:
                status = "ok" if rc == 0 else "error"
        res = {"id": job.req["id"], "status": status, "exit_code": rc, "stdout": stdout, "stderr": stderr,
               "duration_s": round(time.monotonic() - job.start, 4)}
        _answer(res)
        _rmtree(job.jobdir)
        free.append(job.slot)

    def _take(job, which, chunk):
        buf = job.out if which == "out" else job.err
        room = job.cap - len(buf)
        buf += chunk[:max(room, 0)]
        if len(chunk) > room and job.status is None:
            job.status = "output-limit"
            _kill_group(job.pid)

    while True:
        while queue and free:
            start(queue.pop(0))
        now = time.monotonic()
        for job in jobs.values():
            if job.rc is None and job.status is None and now >= job.deadline:
                job.status = "timeout"
                _kill_group(job.pid)
        # Reap: our direct children (jobs) and adopted orphans (we are a subreaper).
        while True:
            try:
                pid, st = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            job = jobs.get(pid)
            if job is not None:
                job.rc = os.waitstatus_to_exitcode(st)
        for pid in [p for p, j in jobs.items() if j.rc is not None]:
            finish(jobs.pop(pid))
        if eof and not jobs and not queue:
            return
        deadlines = [j.deadline for j in jobs.values() if j.rc is None and j.status is None]
        wait = 0.05 if not deadlines else max(0.0, min(min(deadlines) - time.monotonic(), 0.05))
        if jobs and all(j.open == 0 for j in jobs.values()):
            wait = min(wait, 0.002)  # output closed: the exit is imminent, poll waitpid soon
        for key, _ in sel.select(wait):
            if key.data == "wake":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass
                continue
            if key.data is None:
                try:
                    chunk = os.read(stdin_fd, 1 << 20)
                except BlockingIOError:
                    continue
                if not chunk:
                    eof = True
                    sel.unregister(stdin_fd)
                    continue
                inbuf += chunk
                *lines, inbuf = inbuf.split(b"\n")
                queue.extend(json.loads(line) for line in lines if line.strip())
                continue
            job, which = key.data
            try:
                chunk = os.read(key.fd, READ_CHUNK)
            except BlockingIOError:
                continue
            if chunk:
                _take(job, which, chunk)
            else:
                sel.unregister(key.fd)
                os.close(key.fd)
                job.open -= 1


if __name__ == "__main__":
    main()
