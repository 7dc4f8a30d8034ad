"""Contained execution of model-written Python code: one process per execution, limits, a pool.

RL on programming tasks runs code the policy wrote, millions of times, next to the trainer. `Sandbox.run(code,
tests, entry_point)` executes `code`, then each test statement (`assert f(2) == 4`), in a fresh, contained
process and returns an `ExecResult`; `SandboxPool` runs many at once. Modules (import from them; this
package re-exports nothing): result.py, isolation.py, harness.py (process layout and cleanup), execute.py,
pool.py.

Isolation levels (strongest first; `detect_isolation()` picks the strongest that works here, once per process;
`Sandbox.level` / `ExecResult.isolation` report it). Auto-detection degrades with a warning; an explicit level
(`Sandbox(isolation="bwrap")`) raises `SandboxError` when it does not work here.
- "bwrap" (`apt-get install bubblewrap`): new PID, network, IPC and UTS namespaces; the root filesystem
  read-only; a private, size-limited tmpfs on /tmp; a fresh /proc and a minimal /dev. Loopback listeners of
  the host are unreachable; nothing outside /tmp can be written.
- "unshare": `unshare --net --pid --ipc --uts --fork --mount-proc` (root or unprivileged user namespaces);
  the harness makes every mount read-only (`mount_setattr`, Linux >= 5.12) and mounts fresh tmpfs on /tmp,
  /var/tmp and /dev/shm: the same guarantees as bwrap.
- "rlimit": resource limits and a separate user id only. The code can open sockets and write to
  world-writable directories (/tmp); a loud `SandboxWarning` says so. Without root (no separate uid) it can
  also signal the trainer's processes and read their environment: use it only for trusted code.
Every level also applies RLIMIT_CPU, RLIMIT_AS, RLIMIT_NPROC (fork bombs), RLIMIT_FSIZE, RLIMIT_NOFILE, no
core dumps, `PR_SET_NO_NEW_PRIVS`, a scrubbed environment (PATH, HOME, TMPDIR, LANG), stdin from /dev/null,
a private work directory, and a wall clock and output cap (the parent kills the whole tree at either).

Separate user ids. RLIMIT_NPROC is per user and not enforced for root; file permissions and signals are per
user too. So under root (as in CI) each slot leases its own unused uid (61000 upward; a lock file under the
temp dir keeps processes from sharing one) and the code runs under it: a fork bomb is capped per slot, and
the code can neither signal the trainer nor write anything not world-writable. An interpreter under a
directory that uid cannot enter (pyenv under /root, mode 0700) is reached by bwrap and unshare through a
tmpfs over that directory with only its prefix bound back, read-only; at the rlimit level a world-readable
interpreter (/usr/bin/python3) is used instead, or, if none exists, the code runs as root with a warning.

Results channel. C (the process running the code) reports each test as `<nonce> test <i> <ok> <error>` on
a dedicated pipe (not stdout), the nonce being 128 random bits from the parent; H (the harness, C's parent)
adds `<nonce> exit ...` with C's exit status and CPU time. The parent counts only nonce'd lines, one result
per test index, and needs H's exit line and C's `done` line to call a run finished. Defended (checked in
tests/unit/test_sandbox.py):
- fake results printed, in any format, on stdout or stderr;
- `sys.exit`, `os._exit`, `quit()`, `raise SystemExit/KeyboardInterrupt` anywhere: an exception fails the
  test; exiting before `done` is a `crash` and unreported tests fail;
- monkeypatching `builtins`: tests run with a snapshot of the builtins taken before the solution ran, and
  the harness keeps its own references;
- "always equal" answers (`__eq__` returning True, int/list subclasses): the entry point's return value
  must be built-in data of exact built-in types, recursively, else the test fails (so a class or generator
  as the answer fails by design);
- killing, tracing or signalling the harness, the trainer or other processes (PID namespace or separate
  uid; not at the rlimit level without root); closing or spamming the pipe (missing lines are failures);
- resource exhaustion (CPU, memory, processes, output, disk in the private tmpfs).
Not defended: the solution shares the tests' interpreter, so code that goes looking can read the nonce or
the expected values from memory (`gc`, frames, `ctypes`), install a trace function that skips the `assert`,
or replace modules the tests import. Such reward hacking is deliberate and visible in traces; the guarantees
are about containment (the trainer is never harmed) and cheap forgeries. World-readable files are readable
at every level. Aggregate memory is bounded by `processes x memory_mb` per sandbox (no cgroups).
"""
