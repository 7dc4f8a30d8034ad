"""The harness that runs inside the sandbox: stdlib only, never imports keelrl.

`Sandbox.run` passes this file's source to `python -I -S -B -c` inside the launcher (bwrap / unshare /
nothing) and the job (marshal) on stdin. H (this process) sets the sandbox up; C (forked) runs the
model's code, then calls its entry point on each call's arguments and reports each answer as JSON (or
the exception it raised). C shares its interpreter with the model's code, so nothing C reports is
trusted beyond "this is what the code gave": C holds no expected output and decides nothing; the judge
(judge.py) compares, in the trainer's process. Tests import this module to call its functions
in-process; importing it runs nothing.

Process layout and cleanup. H sets up mounts and the work directory and forks C, which sets the limits,
drops to the slot's uid and runs the solution and the tests. When C exits, H kills everything C left behind
(in a PID namespace: `kill(-1)`; at the rlimit level: `kill(-1)` from a helper running as the slot's uid,
or, without root, a scan of the children H collected as a child subreaper) and reaps it. If the parent
stops a run (wall clock, output cap), it SIGKILLs the launcher's children and process group and waits on
their pidfds; a dying PID-namespace init takes its namespace with it. Either way no process the code
started is alive when `run` returns (tested for forks, busy children, `setsid` daemons). If the trainer is
killed mid-run, bwrap (`--die-with-parent`) and unshare (`setpriv --pdeathsig KILL`, `--kill-child`) take
the namespace down; at the rlimit level H and C die with their parents (PR_SET_PDEATHSIG), and a surviving
grandchild is killed (and the work directory removed) when the slot's uid is next leased.
"""

# printf-style `%` on purpose: unlike f-strings and str.format it never calls an object's __format__
# ruff: noqa: UP031
import os
import sys


def _main():
    # cheap imports only: json and signal alone would cost ~25 ms
    import marshal
    import resource
    import time

    job = marshal.loads(sys.stdin.buffer.read())
    fd, nonce, level, uid, work = job["fd"], job["nonce"], job["level"], job["uid"], job["work"]
    write, exit_now = os.write, os._exit

    def emit(line):
        data = ("%s %s\n" % (nonce, line)).encode("utf-8", "replace")
        while data:
            data = data[write(fd, data) :]

    def record(kind, text=""):
        emit("%s %s" % (kind, text.replace("\n", " ")[:500]))

    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    libc = None
    if level != "bwrap":
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
    try:
        if level != "rlimit" and os.readlink("/proc/self/ns/pid") == job["host_pidns"]:
            raise RuntimeError("expected a private PID namespace")
        if level == "unshare":
            _private_root(libc, job, ctypes)
        if level == "rlimit":
            # die with the trainer (PR_SET_PDEATHSIG), collect C's orphans (PR_SET_CHILD_SUBREAPER)
            if libc.prctl(1, 9, 0, 0, 0) != 0 or os.getppid() != job["parent_pid"]:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG), or the trainer is gone")
            if libc.prctl(36, 1, 0, 0, 0) != 0:
                raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER)")
        os.makedirs(work, 0o700, exist_ok=True)
        if uid is not None:
            os.chown(work, uid, uid)
        os.chmod(work, 0o700)
    except Exception as err:
        record("fault", "harness setup: %s: %s" % (type(err).__name__, err))
        exit_now(0)
    record("start")
    child = os.fork()
    if child == 0:
        code = 71
        try:
            _child(job, record, emit, libc, resource)
            code = 0
        finally:
            exit_now(code)
    while True:
        pid, status, usage = os.wait4(-1, 0)
        if pid == child:
            break
    _cleanup(level, uid, time)
    how = "signal %d" % os.WTERMSIG(status) if os.WIFSIGNALED(status) else "code %d" % os.WEXITSTATUS(status)
    record("exit", "%s cpu %.4f rss %d" % (how, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
    exit_now(0)


def _private_root(libc, job, ctypes):
    # unshare level: H is root in a private mount namespace. Build a new root on a tmpfs holding only
    # `job["layout"]` (the system's programs and libraries, /etc, the interpreter's prefix: read-only
    # binds or symlinks), a few devices, /proc and fresh tmpfs on /tmp and /dev/shm, cover the paths in
    # `job["hide"]`, then pivot into it and detach the old root: no host socket, run directory or data
    # file outside the layout exists in there (the same root bwrap builds).
    def check(ret, what):
        if ret != 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    def mount(src, target, fstype, flags, data=None):
        def enc(s):
            return None if s is None else s.encode()

        ret = libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
        check(ret, "mount " + target)

    u64 = ctypes.c_uint64

    class MountAttr(ctypes.Structure):
        _fields_ = [("set", u64), ("clr", u64), ("prop", u64), ("userns", u64)]  # noqa: RUF012

    MS_NOSUID, MS_NODEV, MS_BIND, MS_REC, MS_PRIVATE = 2, 4, 4096, 16384, 1 << 18
    pivot_root = {"x86_64": 155, "aarch64": 41}.get(os.uname().machine)
    if pivot_root is None:
        raise OSError("no pivot_root syscall number known for %s" % os.uname().machine)
    new = "/tmp"
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=755")
    for path, link in job["layout"]:
        os.makedirs(os.path.dirname(new + path), 0o755, exist_ok=True)
        if link is not None:
            os.symlink(link, new + path)
        else:
            os.makedirs(new + path, 0o755, exist_ok=True)
            mount(path, new + path, None, MS_BIND | MS_REC)
    for place in ("/dev", "/dev/shm", "/proc", "/tmp"):
        os.makedirs(new + place, 0o755, exist_ok=True)
    for dev in ("null", "zero", "full", "random", "urandom"):
        os.close(os.open(new + "/dev/" + dev, os.O_CREAT | os.O_WRONLY, 0o644))
        mount("/dev/" + dev, new + "/dev/" + dev, None, MS_BIND)
    mount("/proc", new + "/proc", None, MS_BIND | MS_REC)
    for path in job["hide"]:
        if os.path.isdir(new + path):
            mount("tmpfs", new + path, "tmpfs", MS_NOSUID | MS_NODEV, "size=4096,mode=755")
        elif os.path.exists(new + path):
            mount("/dev/null", new + path, None, MS_BIND)
    attr = MountAttr(1, 0, 0, 0)  # MOUNT_ATTR_RDONLY
    libc.syscall.restype = ctypes.c_long
    at_recursive, size = ctypes.c_uint(0x8000), ctypes.c_size_t(ctypes.sizeof(attr))
    ret = libc.syscall(
        ctypes.c_long(442), ctypes.c_int(-100), new.encode(), at_recursive, ctypes.byref(attr), size
    )
    check(ret, "mount_setattr(read-only)")  # syscall 442: mount_setattr; -100: AT_FDCWD
    mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=755" % job["tmp_bytes"])
    mount("tmpfs", new + "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
    os.chdir(new)
    check(libc.syscall(ctypes.c_long(pivot_root), b".", b"."), "pivot_root")
    check(libc.umount2(b".", 2), "umount the old root")  # MNT_DETACH
    os.chdir("/")


def _child(job, record, emit, libc, resource):
    lim = job["limits"]
    try:
        R = resource
        for which, soft, hard in (
            (R.RLIMIT_CORE, 0, 0),
            (R.RLIMIT_NOFILE, 64, 64),
            (R.RLIMIT_FSIZE, lim["file_bytes"], lim["file_bytes"]),
            (R.RLIMIT_CPU, lim["cpu_s"], lim["cpu_s"] + 1),
            (R.RLIMIT_NPROC, lim["processes"], lim["processes"]),
            (R.RLIMIT_AS, lim["memory_bytes"], lim["memory_bytes"]),
        ):
            R.setrlimit(which, (soft, hard))
        if job["uid"] is not None and not _become(job["uid"]):
            raise RuntimeError("could not drop privileges")
        if libc is not None:  # bwrap does both itself
            if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS
                raise OSError("prctl(PR_SET_NO_NEW_PRIVS) failed")
            if libc.prctl(1, 9, 0, 0, 0) != 0:  # PR_SET_PDEATHSIG (after setuid, which clears it)
                raise OSError("prctl(PR_SET_PDEATHSIG) failed")
        os.chdir(job["work"])
        os.umask(0o077)
    except Exception as err:
        record("fault", "limits: %s: %s" % (type(err).__name__, err))
        os._exit(70)
    _run(job, record, emit)


def _become(uid):
    """Drop this process to `uid` (no supplementary groups, gid = uid); True when it now runs as that uid."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    return os.getuid() == uid and os.geteuid() == uid


def _encoder():
    """value -> compact ASCII JSON (no NaN), or an exception: the C encoder (the `json` package costs
    ~15 ms of imports per execution), or `json.dumps` where its private signature differs."""
    try:
        import _json

        def refuse(value):
            raise TypeError("%s is not JSON data" % type(value).__name__)

        enc = _json.make_encoder(
            {}, refuse, _json.encode_basestring_ascii, None, ":", ",", False, False, False
        )
        enc([1], 0)
        return lambda value: "".join(enc(value, 0))
    except (ImportError, TypeError, AttributeError):
        import json

        return lambda value: json.dumps(value, separators=(",", ":"), allow_nan=False)


def _run(job, record, emit):
    import builtins

    # Captured before the model's code runs. This protects honest answers from accidents; it is not a
    # defence (the code can reach anything in this process): whatever C reports is only "the answer".
    _type, _id, _str, _enumerate, _compile, _exec, _eval = type, id, str, enumerate, compile, exec, eval
    _BaseException, _NameError, _len, _list = BaseException, NameError, len, list
    _exit, _stdout, _stderr = os._exit, sys.stdout, sys.stderr
    encode = _encoder()
    pristine = dict(builtins.__dict__)
    exception_names = {
        id(v): v.__name__ for v in pristine.values() if isinstance(v, type) and issubclass(v, BaseException)
    }

    def describe(err):
        try:
            name = _type(err).__name__
            text = _str(err)
        except _BaseException:
            return "exception (unprintable)"
        return name + (": " + text if text else "")

    def raised(err):
        try:
            names = [exception_names[_id(c)] for c in _type(err).__mro__ if _id(c) in exception_names]
        except _BaseException:
            names = []
        return ",".join(names) or "BaseException"

    def pack(*args, **kwargs):
        return args, kwargs

    try:
        code = _compile(job["code"], "<solution>", "exec", dont_inherit=True)
    except _BaseException as err:
        record("syntax", describe(err))
        return
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        _exec(code, namespace)
    except _BaseException as err:
        record("load", describe(err))
        return
    entry, budget = job["entry_point"], job["answer_bytes"]
    fn = namespace.get(entry) if entry else None
    for i, (src, show) in _enumerate(job["calls"]):
        try:
            if fn is None:
                raise _NameError("the solution does not define %s" % entry)
            call = _compile("pack(%s)" % src, "<call %d>" % i, "eval", dont_inherit=True)
            args, kwargs = _eval(call, {"__builtins__": pristine, "pack": pack})
            value = fn(*args, **kwargs)
        except _BaseException as err:
            record("answer", "%d raised %s %s" % (i, raised(err), describe(err)))
            continue
        try:
            texts = [encode(value)] + ([encode(_list(args))] if show else [])
        except _BaseException as err:
            record("answer", "%d invalid %s" % (i, describe(err)))
            continue
        budget -= _len(texts[0]) + (_len(texts[1]) if show else 0)
        if budget < 0:
            record("answer", "%d invalid answers over %d bytes" % (i, job["answer_bytes"]))
            continue
        emit("answer %d value %s" % (i, texts[0]))
        if show:
            emit("args %d %s" % (i, texts[1]))
    record("done")
    for stream in (_stdout, _stderr):
        try:
            stream.flush()
        except _BaseException:
            pass
    _exit(0)


def _cleanup(level, uid, time):
    SIGKILL = 9
    # Kill and reap everything C left behind. Never kill(-1) outside a private PID namespace as root.
    if level != "rlimit":
        try:
            os.kill(-1, SIGKILL)
        except ProcessLookupError:
            pass
    elif uid is not None:
        killer = os.fork()
        if killer == 0:
            try:
                if _become(uid):
                    os.kill(-1, SIGKILL)  # one pass reaches all: forks racing it fail (SIGKILL pending)
                    os.kill(-1, SIGKILL)
            except ProcessLookupError:
                pass
            finally:
                os._exit(0)
        os.waitpid(killer, 0)
    else:
        deadline = time.monotonic() + 2.0
        me = os.getpid()
        while time.monotonic() < deadline:
            kids = children_of(me)
            if not kids:
                break
            for k in kids:
                try:
                    os.kill(k, SIGKILL)
                except ProcessLookupError:
                    pass
            while True:
                try:
                    if os.waitpid(-1, os.WNOHANG)[0] == 0:
                        break
                except ChildProcessError:
                    break
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                time.sleep(0.001)
        except ChildProcessError:
            break


def children_of(pid):
    """Processes whose parent is `pid`, from /proc (/proc/PID/task/*/children needs a kernel option)."""
    kids = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open("/proc/%s/stat" % name, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            if int(data[data.rindex(b")") + 2 :].split()[1]) == pid:
                kids.append(int(name))
    return kids


if __name__ == "__main__":  # `python -c` runs this file as __main__
    _main()
