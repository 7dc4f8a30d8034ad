"""The trusted harness that runs inside the sandbox: stdlib only, never imports keelrl.

`Sandbox.run` passes this source to `python -I -S -B -c` inside the launcher and the job (marshal) on stdin.
H (this process) is trusted; C (forked) runs the model's code. Everything C uses after the solution has
run is captured in locals first. Tests import this module; importing it runs nothing.

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

    def record(kind, text=""):
        write(fd, ("%s %s %s\n" % (nonce, kind, text.replace("\n", " ")[:500])).encode("utf-8", "replace"))

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
            _private_mounts(libc, job, ctypes)
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
            _child(job, record, libc, resource)
            code = 0
        finally:
            exit_now(code)
    status, usage = 0, None
    while True:
        pid, st, ru = os.wait4(-1, 0)
        if pid == child:
            status, usage = st, ru
            break
    _cleanup(level, uid, time)
    if os.WIFSIGNALED(status):
        how = "signal %d" % os.WTERMSIG(status)
    else:
        how = "code %d" % os.WEXITSTATUS(status)
    record("exit", "%s cpu %.4f rss %d" % (how, usage.ru_utime + usage.ru_stime, usage.ru_maxrss))
    exit_now(0)


def _private_mounts(libc, job, ctypes):
    # unshare level: H is root in a private mount namespace. Make every mount read-only, then put fresh
    # tmpfs on the writable places, and, when the interpreter sits under a directory the sandbox uid
    # cannot enter, cover that directory with a tmpfs holding only the interpreter's prefix (read-only).
    def check(ret, what):
        if ret != 0:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    def mount(src, target, fstype, flags, data):
        def enc(s):
            return None if s is None else s.encode()

        ret = libc.mount(enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data))
        check(ret, "mount " + target)

    u64 = ctypes.c_uint64

    class MountAttr(ctypes.Structure):
        _fields_ = [("set", u64), ("clr", u64), ("prop", u64), ("userns", u64)]  # noqa: RUF012

    MS_RDONLY, MS_NOSUID, MS_NODEV, MS_REMOUNT, MS_BIND, MS_REC = 1, 2, 4, 32, 4096, 16384
    attr = MountAttr(1, 0, 0, 0)  # MOUNT_ATTR_RDONLY
    libc.syscall.restype = ctypes.c_long
    at_recursive, size = ctypes.c_uint(0x8000), ctypes.c_size_t(ctypes.sizeof(attr))
    ret = libc.syscall(ctypes.c_long(442), ctypes.c_int(-100), b"/", at_recursive, ctypes.byref(attr), size)
    check(ret, "mount_setattr(/, read-only)")  # syscall 442: mount_setattr; -100: AT_FDCWD
    mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "size=%d,mode=755" % job["tmp_bytes"])
    for small in ("/var/tmp", "/dev/shm"):
        if os.path.isdir(small):
            mount("tmpfs", small, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
    hidden, prefix = job["hidden"], job["prefix"]
    if hidden:
        stage = "/tmp/.keelrl-prefix"
        os.mkdir(stage, 0o755)
        mount(prefix, stage, None, MS_BIND | MS_REC, None)
        mount("tmpfs", hidden, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=755")
        path = hidden
        for part in os.path.relpath(prefix, hidden).split("/"):
            path = os.path.join(path, part)
            os.mkdir(path)
            os.chmod(path, 0o755)
        mount(stage, prefix, None, MS_BIND | MS_REC, None)
        mount(None, prefix, None, MS_REMOUNT | MS_BIND | MS_RDONLY, None)
        check(libc.umount2(stage.encode(), 2), "umount " + stage)  # MNT_DETACH
        os.rmdir(stage)


def _child(job, record, libc, resource):
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
        uid = job["uid"]
        if uid is not None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            if os.getuid() != uid or os.geteuid() != uid:
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
    _run(job, record)


def _run(job, record):
    import builtins

    # Captured before any model code runs: the harness never looks these names up again.
    _type, _id, _str, _enumerate, _compile, _exec = type, id, str, enumerate, compile, exec
    _BaseException, _TypeError, _callable, _dict = BaseException, TypeError, callable, dict
    _exit, _stdout, _stderr = os._exit, sys.stdout, sys.stderr
    snapshot = _dict(builtins.__dict__)
    scalar = {_id(t) for t in (int, float, complex, bool, str, bytes, type(None))}
    containers = {_id(t) for t in (list, tuple, set, frozenset)}
    dict_type = dict

    def describe(err):
        try:
            name = _type(err).__name__
            text = _str(err)
        except _BaseException:
            return "exception (unprintable)"
        return name + (": " + text if text else "")

    def check(value, depth, name):
        t = _type(value)
        if _id(t) in scalar:
            return
        if depth < 64:
            if _id(t) in containers:
                for item in value:
                    check(item, depth + 1, name)
                return
            if t is dict_type:
                for k in value:
                    check(k, depth + 1, name)
                    check(value[k], depth + 1, name)
                return
        what = "a value nested too deep" if depth >= 64 else "a value of type " + t.__name__
        raise _TypeError(
            "%s returned %s; answers must be built-in data (numbers, str, bytes, None, list, "
            "tuple, dict, set) of exact built-in types" % (name, what)
        )

    def guard(fn, name):
        def guarded(*args, **kwargs):
            result = fn(*args, **kwargs)
            check(result, 0, name)
            return result

        return guarded

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
    test_ns = _dict(namespace)
    test_ns["__builtins__"] = snapshot
    entry = job["entry_point"]
    if entry:
        fn = namespace.get(entry)
        if fn is not None and _callable(fn):
            test_ns[entry] = guard(fn, entry)
    for i, src in _enumerate(job["tests"]):
        try:
            _exec(_compile(src, "<test %d>" % i, "exec", dont_inherit=True), test_ns)
        except _BaseException as err:
            record("test", "%d 0 %s" % (i, describe(err)))
        else:
            record("test", "%d 1" % i)
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
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)
                if os.getuid() == uid and os.geteuid() == uid:
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
