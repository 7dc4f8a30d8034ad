"""Contained execution of model-written Python code: one process per execution, limits, a pool.

RL on programming tasks runs code the policy wrote, millions of times, next to the trainer, its run
directory and its checkpoints. `Sandbox.run(code, tests, entry_point)` executes `code` and then each
test statement (e.g. `assert f(2) == 4`) in a fresh, contained process and returns an `ExecResult`
(status, tests passed / total, timing, output excerpts). `SandboxPool` runs many at once.

Isolation levels (strongest first; `detect_isolation()` picks the strongest that works here, once per
process, and `Sandbox.level` / `ExecResult.isolation` report the one in use):
- "bwrap": bubblewrap (`apt-get install bubblewrap`). New PID, network, IPC and UTS namespaces; the root
  filesystem bind-mounted read-only; a private, size-limited tmpfs on /tmp; a fresh /proc and a minimal
  /dev. Loopback listeners of the host are unreachable; nothing outside /tmp can be written.
- "unshare": util-linux `unshare --net --pid --ipc --uts --fork --mount-proc` (needs root or unprivileged
  user namespaces). Inside the private mount namespace the harness makes every mount read-only
  (`mount_setattr`, Linux >= 5.12) and mounts fresh tmpfs on /tmp, /var/tmp and /dev/shm, which gives
  the same guarantees as bwrap.
- "rlimit": resource limits and a separate user id only. No network or filesystem isolation beyond
  file permissions: the code can open sockets and write to world-writable directories (/tmp). A loud
  `SandboxWarning` says so. Without root (no separate user id) it can also signal the trainer's
  processes and read their environment: use it only for trusted code.
Auto-detection degrades with a warning; asking for a level explicitly (`Sandbox(isolation="bwrap")`)
raises `SandboxError` when that level does not work here.

Every level also applies, to the process running the model's code: RLIMIT_CPU (CPU seconds),
RLIMIT_AS (memory), RLIMIT_NPROC (processes and threads: fork bombs), RLIMIT_FSIZE (file size),
RLIMIT_NOFILE, no core dumps, `PR_SET_NO_NEW_PRIVS`, a scrubbed environment (PATH, HOME, TMPDIR, LANG
only: nothing of the trainer's variables), stdin from /dev/null, a private working directory, and a
wall-clock limit and an output cap enforced by the parent, which kills the whole tree when either is hit.

Separate user ids. RLIMIT_NPROC is per user, and the kernel does not enforce it for root; file
permissions and signals are per user too. So when keelrl runs as root (as in CI), each sandbox slot
leases its own unused uid (61000 upward; a lock file under the temp dir keeps concurrent processes from
sharing one) and the model's code runs under it: a fork bomb is capped per slot, the code cannot signal
the trainer, and it cannot write anything not world-writable. When the interpreter lives under a
directory that uid cannot enter (e.g. pyenv under /root, mode 0700), bwrap and unshare mount a tmpfs
over that directory with only the interpreter's prefix bound back, read-only; at the rlimit level a
world-readable interpreter (/usr/bin/python3) is used instead, or, if none exists, the code runs as root
with a warning.

Layout: result.py (limits, jobs, results, reading the records), isolation.py (the levels: launchers,
detection, uid leases), harness.py (the program that runs inside; its docstring describes the process
layout and cleanup), execute.py (`Sandbox`), pool.py (`SandboxPool`).
Import the names from those modules; this package re-exports nothing.

Results channel and what the harness defends against. C (the process running the code) reports each
test as a line `<nonce> test <i> <ok> <error>` written to a dedicated pipe (not stdout), where the nonce
is 128 random bits from the parent; H (the harness, C's parent) adds `<nonce> exit ...` with C's exit status and CPU time. The parent counts
only lines with the nonce, one result per test index, and needs H's exit line and C's `done` line to
call a run finished. Defended (by construction, checked in tests/unit/test_sandbox.py):
- printing fake results, in any format, on stdout or stderr (only the nonce'd pipe counts);
- `sys.exit`, `os._exit`, `quit()`, `raise SystemExit/KeyboardInterrupt` at any point: an exception is
  a failed test; exiting before `done` is a `crash` and unreported tests count as failed;
- monkeypatching `builtins` (e.g. `builtins.sorted`, `AssertionError`, `isinstance`): tests run with a
  snapshot of the builtins taken before the solution ran, and the harness keeps its own references;
- "always equal" answers (objects whose `__eq__` returns True, int/list subclasses): the entry point is
  wrapped so its return value must be built-in data of exact built-in types (numbers, str, bytes,
  None, list, tuple, dict, set, frozenset, recursively), else the test fails;
- killing, tracing or signalling the harness, the trainer or other processes (PID namespace, or a
  separate uid; not at the rlimit level without root), closing or spamming the result pipe (fails
  closed: missing lines are failures);
- resource exhaustion (CPU, memory, processes, output, disk in the private tmpfs).
Not defended: the solution runs in the same interpreter as the tests, so code that goes looking can
read the nonce or the tests' expected values from memory (`gc`, frame introspection, `ctypes`),
install a trace function that skips the `assert`, or replace modules that tests import. Such reward
hacking is deliberate and visible in traces; the guarantees above are about containment (the trainer
is never harmed) and about accidental or cheap forgeries. Reading world-readable files is allowed at
every level (nothing secret should be world-readable); at the rlimit level the network is open and the
code can write to world-writable directories. Aggregate memory is bounded by `processes x memory_mb`
per sandbox, not by one number (no cgroups).

Entry points must be functions returning built-in data; a class or generator as the answer fails the
return check by design.
"""
