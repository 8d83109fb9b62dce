"""The code sandbox: untrusted programs run against tests (docs/methods.md §7, TAG code task).

The TAG code channels (``mr_rl.rewards.code_channels``) score one run of this sandbox:
correctness ``RP = 1`` iff every test passes (per-test timeouts: small 10 s, medium 30 s);
the auxiliary channels *fast* (runtime < 60 ms) and *no-op* (runtime < 3 ms) read its
``runtime_s``.

API (exported here):
  * ``CodeTests.humaneval(test_src, entry_point, prompt=None)``,
    ``CodeTests.stdio(pairs)``, ``CodeTests.call(fn_name, inputs, outputs)``.
  * ``run(program, tests, *, timeout_s) -> CodeResult(passed, runtime_s, error, ...)``
    and ``run_many`` (a bounded thread pool; each run is its own process tree).
  * ``SandboxConfig`` (limits and policy), ``sandbox_capabilities()`` (what isolation this
    machine provides, a ``SandboxCapabilities``), ``SandboxError`` (the sandbox cannot be
    set up as required), ``SMALL_TEST_TIMEOUT_S`` / ``MEDIUM_TEST_TIMEOUT_S``.
  * ``require_timeout``: the argument check for a positive finite number of seconds.

Modules: ``spec`` (CodeTests, CodeResult, SandboxConfig), ``runs`` (run, run_many),
``capabilities`` (the live probe and the per-run harness config), ``host`` (the fork server
and one run's I/O), and the harness that runs inside the sandbox, stdlib only, shipped as
code objects in the order of ``host.HARNESS_FILES``: ``wire`` (value codec, framing),
``kernel`` (namespaces, mounts, credentials, seccomp), ``cgroups`` (memory cgroups),
``check`` (the supervisor's checker) and ``harness`` (process roles).

Isolation (each run; see ``harness.py`` for the process layout and docs/rewards.md
"Code sandbox: threat model" for what is promised and how each promise is tested):
  * a fresh process tree in its own session, killed as a process group after the verdict
    or at the wall-clock deadline (the tests' time budget plus ``startup_grace_s``). Its
    supervisor is forked by a fork server (``python -I -S -c <harness>``, the harness
    passed as marshalled code objects on the command line, so no file can be swapped
    under a run); a trainer has one server per concurrent run slot, each serving one run
    at a time, and a server never sees a job;
  * namespaces: each slot's server holds a user namespace that maps only the slot's
    uid/gid (so RLIMIT_NPROC counts per slot: a fork bomb cannot starve a concurrent run);
    per run, new network (no interface up, not even loopback), pid (the zygote is pid 1:
    when it dies every process of the run dies), mount, IPC (SysV and POSIX IPC objects
    die with the run) and UTS namespaces;
  * files: a root of its own (``pivot_root`` onto a tmpfs) that shows, read-only, only
    ``SandboxConfig.visible_paths`` (``/usr``, ``/etc``, ``/lib*``, ...) and the interpreter
    prefix (less its site-packages and ``hidden_paths``; ``sys.executable`` is the real
    interpreter binary, so a run can start Python even when the trainer runs from a venv):
    no host socket, FIFO or lock file of ``/run``, ``/var``, ``/tmp``, a checkout; ``/dev``
    holds null, zero, full, random, urandom, std* links to a stdin/stdout test's files and a
    private devpts of at most ``max_ptys`` terminals; ``/tmp``, ``/var/tmp`` and ``/dev/shm``
    are one private tmpfs of ``tmpfs_bytes``, the working directory and the only writable
    place, gone with the run; no ``/proc`` (it shows machine-wide counters, and a process's
    own page mappings tell which pages of a shared file are cached) and no ``/sys``;
  * credentials: as root each slot runs as its own host uid from ``uid_range`` (so the
    kernel's per-uid counts - descriptors in flight, pipe pages - are per slot; its user
    namespace is made by that uid, so queued signals, POSIX timers and message-queue bytes,
    bounded by ``max_pending_signals`` / ``max_mq_bytes``, are the slot's), gid 65534,
    with no supplementary groups and no capabilities (also none in its user namespace), so
    it cannot write the checkout or ``$HOME`` even without the read-only mounts;
    ``no_new_privs`` (setuid binaries do not elevate); a fresh, empty session keyring (the
    trainer's keys are out of reach); supervisor and zygote non-dumpable;
  * a seccomp filter on the zygote and everything it forks (``seccomp.DENIED`` and
    ``seccomp.ARG_RULES``: ptrace, keyrings, mount, namespaces, bpf, perf, userfaultfd,
    io_uring, Linux AIO, kexec and modules, mincore, file locks and leases, hugetlb pages,
    socket families other than unix/inet/inet6, getrusage and rusage of waits,
    PR_SET_DUMPABLE, sysinfo, ...);
  * memory: ``memory_limit="cgroup"`` (default) puts each server, and so every process of
    its runs, in a memory cgroup of ``memory_bytes`` (v2, or v1; swap included), with the
    run's processes first in line for the OOM killer; rlimits on the worker: address
    space, CPU seconds, processes, file size (which also caps captured output), open
    files, no core files, no real-time scheduling;
  * CPU: each server is also in a CPU cgroup with a quota of ``cpus`` (default 1 CPU per
    run; one scheduler group, however many sessions the run makes);
  * disk: and in an io (v2) / blkio (v1) cgroup capping reads and writes of every disk at
    ``io_bps`` bytes and ``io_iops`` operations per second;
  * a scrubbed environment (PATH, LANG, HOME=TMPDIR=working directory).
  Not root: no uid change and no cgroup are possible; the harness uses an unprivileged
  user namespace (the same namespaces, mounts and filter) where the kernel allows one, and
  nothing where it does not (no network, pid, IPC or /tmp isolation, the host writable
  wherever the caller may write). ``sandbox_capabilities()`` reports each layer, and
  ``run`` raises ``SandboxError`` for a missing one unless the config relaxes it
  (``require_privilege_drop``, ``require_network_isolation``, ``require_seccomp``,
  ``memory_limit="per-process"``). Not handled in any mode: the candidate can READ
  world-readable files (including installed data sets), and concurrent runs share the
  machine (timing and load are observable), and which pages of a visible file are cached
  can still be told by timing a read (docs/rewards.md "Not promised").

Evidence of success: the verdict is computed by the supervisor, which never runs
candidate code and reads the tests only after the candidate's process was
forked. The candidate only ever returns *values* (plain JSON data: an object
with a rigged ``__eq__`` arrives as an opaque token) or prints to a file; the
supervisor compares them with expected outputs the candidate never had in its
memory. For HumanEval the data set's ``check`` runs in the supervisor with
``candidate`` bound to a remote stub. The verdict travels on the supervisor's
stdout, a pipe no sandboxed process holds, carrying a per-run nonce that was
also sent only to the supervisor; ``run`` accepts only a verdict with the right
nonce, ``passed`` and ``n_passed == n_tests``. So ``sys.exit(0)``,
``os._exit(0)``, killing the parent, monkeypatching, or printing a success line
all give ``passed=False``.

What ``runtime_s`` measures (interpreter start-up and sandbox set-up excluded):
  * HumanEval / call tests: the supervisor's wall-clock round trip of loading
    the program (compiling and running its top level) plus every call of the
    candidate (arguments and results travel as JSON; about 0.05 ms per call);
  * stdio tests: per test, the zygote's time from ``fork`` of the worker to its
    exit (compiling and running the program, flushing output), summed.
  For a failed run it is the time until the failure; on a timeout it is at
  least the timeout.
"""

from mr_rl.rewards.sandbox.capabilities import SandboxCapabilities
from mr_rl.rewards.sandbox.host import SandboxError
from mr_rl.rewards.sandbox.runs import run, run_many, sandbox_capabilities
from mr_rl.rewards.sandbox.spec import (MEDIUM_TEST_TIMEOUT_S, SMALL_TEST_TIMEOUT_S, CodeResult,
                                        CodeTests, SandboxConfig, require_timeout)

__all__ = ["MEDIUM_TEST_TIMEOUT_S", "SMALL_TEST_TIMEOUT_S", "CodeResult", "CodeTests",
           "SandboxCapabilities", "SandboxConfig", "SandboxError", "require_timeout", "run",
           "run_many", "sandbox_capabilities"]
