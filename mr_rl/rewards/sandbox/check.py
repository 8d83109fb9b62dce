"""The supervisor's checker in the code sandbox: runs the tests against the worker.

Stdlib only; part of the harness that runs inside the sandbox (the files of
``host.HARNESS_FILES``, run in order in one namespace: ``encode``, ``decode``,
``send``, ``recv`` and ``brief`` come from ``wire.py``). It executes in the
SUPERVISOR, which never runs candidate code: the candidate's functions are remote stubs
(``Remote``) that call the WORKER over a pipe and get plain values back, so the verdict
rests only on data the candidate cannot rig.
"""

import time

if __name__ != "__main__":  # on the host; in the sandbox wire.py ran first in this namespace
  from mr_rl.rewards.sandbox.wire import brief, decode, encode, recv, send


class Abort(BaseException):
  """Infrastructure failure inside a check (timeout, dead worker, bad message).

  A BaseException so that a test's ``except Exception`` cannot swallow it.
  """


class CandidateError(Exception):
  """The candidate raised an exception (its type name and message are the text).

  Whatever the candidate raised arrives in the trusted check as this one type, which no
  protocol of the language treats as a signal: a ``StopIteration`` re-raised as itself would
  end a ``map``/``filter``/``next`` in the check early and let it pass (``StopAsyncIteration``
  an ``async for``, ``IndexError`` a ``__getitem__`` iteration, ``AttributeError`` a
  ``getattr`` with a default, ``KeyError`` a ``ChainMap`` lookup, ...). A check that expects
  a particular exception type therefore fails: closed, never open.
  """


# ----------------------------------------------------------------------------- checker
class Channel:
  """S's side of the pipes to Z/W; times every exchange with the worker."""

  def __init__(self, r, w, max_bytes):
    self.r, self.w, self.max_bytes = r, w, max_bytes
    self.runtime = 0.0
    self.deadline = None
    self.calls = 0

  def request(self, msg, timed=True):
    t0 = time.perf_counter()
    send(self.w, msg)
    try:
      reply = recv(self.r, self.deadline, self.max_bytes)
    except TimeoutError:
      self.runtime += time.perf_counter() - t0
      raise Abort("timeout: the test exceeded its time limit") from None
    except (EOFError, ValueError, OSError) as e:
      raise Abort(f"protocol error: {e}") from None
    if timed:
      self.runtime += time.perf_counter() - t0
    if not isinstance(reply, dict):
      raise Abort("protocol error: reply is not an object")
    if reply.get("op") == "exited":
      raise Abort(f"worker exited (wait status {reply.get('status')}); stderr: {reply.get('stderr', '')[-500:]}")
    return reply

  def call(self, fn, args, kwargs, method=False):
    self.calls += 1
    reply = self.request({"op": "call", "fn": fn, "method": method,
                          "args": encode(list(args)), "kwargs": encode(dict(kwargs))})
    if reply.get("ok") is True:
      try:
        return decode(reply.get("value"))
      except (ValueError, TypeError, KeyError, IndexError) as e:
        raise Abort(f"protocol error: undecodable value ({e})") from None
    raise CandidateError(str(reply.get("error"))[:2000])

  def start_worker(self, src, deadline):
    send(self.w, {"op": "spawn"})
    self.deadline = deadline
    try:
      ready = recv(self.r, deadline, self.max_bytes)
    except (TimeoutError, EOFError, ValueError) as e:
      raise Abort(f"worker did not start: {e}") from None
    if ready.get("op") != "ready":
      raise Abort(f"worker did not start: {ready.get('stderr', ready)}")
    reply = self.request({"op": "load", "src": src})
    if reply.get("ok") is not True:
      raise Abort(f"program failed to load: {reply.get('error')}")
    return set(reply.get("names") or ())


class Remote:
  """Callable stub for a function defined by the candidate program."""

  def __init__(self, chan, name):
    self._chan, self._name = chan, name

  def __call__(self, *args, **kwargs):
    return self._chan.call(self._name, args, kwargs)


class FallbackBuiltins(dict):
  """Builtins mapping for the check: unknown names resolve to the program's functions."""

  def __init__(self, chan, names):
    import builtins
    super().__init__(vars(builtins))
    self._chan, self._names = chan, names

  def __missing__(self, key):
    if key in self._names:
      return Remote(self._chan, key)
    raise KeyError(key)


def normalise_stdout(s):
  return "\n".join(" ".join(line.split()) for line in s.strip().splitlines())


def _plain(x):
  if isinstance(x, (list, tuple)):
    return [_plain(e) for e in x]
  if isinstance(x, dict):
    return {k: _plain(v) for k, v in x.items()}
  return x


def check_job(job, chan, timeout):
  """Runs the tests in order, stopping at the first failure.

  Returns:
    (n_passed, error or None, timed_out, runtime_s). runtime_s is the time the
    candidate itself ran: for stdio tests the zygote's fork-to-reap time of each
    run; otherwise S's round-trip time of the program load plus every call.
  """
  tests = job["tests"]
  kind = tests["kind"]
  if kind == "stdio":
    runtime = 0.0
    for i, (stdin, expected) in enumerate(tests["pairs"]):
      chan.deadline = time.monotonic() + timeout + 5.0
      reply = chan.request({"op": "stdio", "src": job["program"], "stdin": stdin, "timeout": timeout},
                           timed=False)
      runtime += float(reply["elapsed"])
      if reply["timed_out"]:
        return i, f"test {i}: timeout after {timeout} s", True, runtime
      if reply["status"] != 0:
        return i, f"test {i}: wait status {reply['status']}; stderr: {reply['stderr'][-500:]}", False, runtime
      if normalise_stdout(reply["stdout"]) != normalise_stdout(expected):
        return i, f"test {i}: wrong output {reply['stdout'][:200]!r}", False, runtime
    return len(tests["pairs"]), None, False, runtime
  names = chan.start_worker(job["program"], time.monotonic() + timeout)
  if kind == "call":
    method = tests["fn_name"] not in names
    for i, (args, expected) in enumerate(zip(tests["inputs"], tests["outputs"])):
      chan.deadline = time.monotonic() + timeout
      try:
        got = chan.call(tests["fn_name"], args, {}, method=method)
      except Exception as e:  # the candidate raised
        return i, f"test {i}: {type(e).__name__}: {e}"[:1000], False, chan.runtime
      if _plain(got) != _plain(expected):
        return i, f"test {i}: expected {brief(expected)}, got {brief(got)}", False, chan.runtime
    return len(tests["inputs"]), None, False, chan.runtime
  # HumanEval: the data set's check() runs here (trusted), candidate calls are remote.
  chan.deadline = time.monotonic() + timeout
  env = {"__name__": "__check__", "__builtins__": FallbackBuiltins(chan, names)}
  try:
    if tests.get("prompt"):
      exec(compile(tests["prompt"], "prompt.py", "exec"), env)
    env[tests["entry_point"]] = candidate = Remote(chan, tests["entry_point"])  # not the prompt's stub
    exec(compile(tests["test_src"], "test.py", "exec"), env)
    env["check"](candidate)
  except Exception as e:
    return 0, f"check failed: {type(e).__name__}: {e}"[:1000], False, chan.runtime
  if chan.calls == 0:
    return 0, "check never called the candidate", False, chan.runtime
  return 1, None, False, chan.runtime
