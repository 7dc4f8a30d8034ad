"""Contained execution of model-written Python code: one process per execution, limits, a pool.

RL on programming tasks runs code the policy wrote, millions of times, next to the trainer, its run
directory and its checkpoints. `Sandbox.run(code, entry_point, calls)` executes `code` in a fresh,
contained process, calls `entry_point` on each call's arguments and returns an `ExecResult` (status,
each call's answer as JSON text or the exception it raised, timing, output excerpts). `SandboxPool`
runs many at once. Whether an answer is right is decided outside, by `judge.py`, in the trainer's
process: the sandbox never holds an expected output (see "The judge" below).

Isolation levels (strongest first; `detect_isolation()` picks the strongest that works here, once per
process, and `Sandbox.level` / `ExecResult.isolation` report the one in use):
- "bwrap": bubblewrap (`apt-get install bubblewrap`). New PID, network, IPC and UTS namespaces, and a
  new root on a tmpfs that holds only `isolation.ROOT_PATHS` (/usr, /bin, /lib*, /sbin, /etc) and the
  interpreter's prefix, bound read-only, a private, size-limited tmpfs on /tmp, a fresh /proc and a
  minimal /dev. The host's /tmp, /run, /var, home directories, checkouts and run directories are not
  there, so no host Unix socket (a daemon's, world-writable or not) can be reached by path; abstract
  Unix sockets and loopback listeners belong to the host's network namespace and are unreachable too.
  Paths given as `hide` (the code task's problems file) are covered even where the root would show them.
  Nothing outside /tmp can be written.
- "unshare": util-linux `unshare --net --pid --ipc --uts --fork --mount-proc` (needs root or unprivileged
  user namespaces). Inside the private mount namespace the harness builds the same root itself (binds,
  `mount_setattr` read-only, Linux >= 5.12; fresh tmpfs on /tmp and /dev/shm), pivots into it and
  detaches the old one: the same guarantees as bwrap.
- "rlimit": resource limits and a separate user id only. No network or filesystem isolation beyond
  file permissions: the code can open sockets (TCP, and Unix sockets by path or in the abstract
  namespace: a host daemon's socket it may write to is reachable), read every world-readable file (the
  code task's problems file, so its answer key, included) and write to world-writable directories
  (/tmp). A loud `SandboxWarning` says so. Without root (no separate user id) it can also signal the
  trainer's processes and read their environment: use it only for trusted code.
Auto-detection degrades with a warning; asking for a level explicitly (`Sandbox(isolation="bwrap")`)
raises `SandboxError` when that level does not work here.

Separate user ids. RLIMIT_NPROC is per user, and the kernel does not enforce it for root; file
permissions and signals are per user too. So when keelrl runs as root (as in CI), each sandbox slot
leases its own unused uid (61000 upward; a lock file under the temp dir keeps concurrent processes from
sharing one) and the model's code runs under it: a fork bomb is capped per slot, the code cannot signal
the trainer, and it cannot write anything not world-writable. When the interpreter lives under a
directory that uid cannot enter (e.g. pyenv under /root, mode 0700), bwrap and unshare show only the
prefix, read-only, under directories of mode 0755 in their own root; at the rlimit level a
world-readable interpreter (/usr/bin/python3) is used instead, or, if none exists, the code runs as root
with a warning.

Layout: result.py (limits, calls, jobs, answers, results, reading the records), isolation.py (the
levels: launchers, the root's layout, detection, uid leases), harness.py (the program that runs inside;
its docstring describes the process layout and cleanup), execute.py (`Sandbox`), pool.py
(`SandboxPool`), judge.py (cases, comparison, verdicts: outside the sandbox).
Import the names from those modules; this package re-exports nothing.

The judge. The model's code runs only to produce answers; the expected outputs and the comparison
live in the trainer's process (judge.py), like a contest judge's. Each call's arguments (Python source,
evaluated inside: inputs are not secret) go in; its return value comes out as JSON text, or the
built-in exception classes of what it raised, or `invalid` (not JSON data: sets, objects, NaN; or over
`SandboxLimits.answer_bytes`). The judge parses that with `json.loads` and compares plain data, so an
object whose `__eq__` lies cannot exist on the judge's side. Everything in the sandbox process is the
model's to change: shadowing globals or builtins (`ValueError = AssertionError`, a `len` of its own),
patching modules, rewriting the harness's job or records through `gc` or frame introspection, writing
records with the nonce; none of it can do more than choose the answers, which is what a solution does.
Of the answer key the sandbox sees nothing: it is not in the job, and the problems file is hidden
(bwrap, unshare; not at the rlimit level, see above). Not defended, by any judge that shows the inputs:
a solution that recognises the test inputs and returns memorised outputs.

Results channel. C (the process running the code) reports each answer as a line `<nonce> answer <i>
...` written to a dedicated pipe (not stdout), where the nonce is 128 random bits from the parent; H
(the harness, C's parent) adds `<nonce> exit ...` with C's exit status and CPU time. The parent counts
only lines with the nonce, the first answer per call, and needs H's exit line and C's `done` line to
call a run finished (`ok`); a call that never answered fails. What the harness guarantees to honest
code (tests/unit/test_sandbox.py):
- printed output, on stdout or stderr, is never taken for an answer;
- `sys.exit`, `os._exit`, `quit()`, `raise SystemExit/KeyboardInterrupt` at any point: an exception in
  a call is that call's answer (it raised); exiting before `done` is a `crash`;
- killing, tracing or signalling the harness, the trainer or other processes (PID namespace, or a
  separate uid; not at the rlimit level without root), closing or spamming the result pipe (fails
  closed: missing answers are failures);
- resource exhaustion (CPU, memory, processes, output, disk in the private tmpfs).
Aggregate memory is bounded by `processes x memory_mb` per sandbox, not by one number (no cgroups).

Entry points must be functions returning JSON data (None, bool, int, float, str, lists / tuples, dicts
with string keys); a class, set or generator as the answer is `invalid` by design.
"""
