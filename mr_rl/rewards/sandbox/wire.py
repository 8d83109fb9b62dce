"""Wire format of the code sandbox: the value codec, message framing, a bounded repr.

Stdlib only. Part of the harness that runs inside the sandbox (the files of
``host.HARNESS_FILES``, run in order in one namespace); also importable on the
host. Values cross from the worker (candidate code) to the supervisor as
plain JSON data, so nothing the candidate defines (a rigged ``__eq__``, a subclass) arrives.
"""

import json
import os
import select
import struct
import time

MAX_DEPTH = 100
TAGS = ("__tuple__", "__set__", "__frozenset__", "__dict__", "__bytes__", "__complex__",
        "__bigint__", "__float__", "__opaque__")
BIG_INT_BITS = 4000  # ints above this travel as hex; ``brief`` does not convert them to decimal


class Opaque:
  """Stands for a value of a type the codec does not carry; equal only to itself."""

  def __init__(self, type_name):
    self.type_name = type_name

  def __repr__(self):
    return f"<opaque {self.type_name}>"


# ----------------------------------------------------------------------------- codec
def encode(x, depth=0):
  """Python value -> JSON-able tagged data (W side; subclasses become base types)."""
  if depth > MAX_DEPTH:
    raise ValueError("value nested too deeply")
  if x is None or x is True or x is False:
    return x
  d = depth + 1
  if isinstance(x, int):
    v = int.__int__(x)
    return {"__bigint__": format(v, "x")} if v.bit_length() > BIG_INT_BITS else v
  if isinstance(x, float):
    v = float.__float__(x)
    return v if v == v and v not in (float("inf"), float("-inf")) else {"__float__": repr(v)}
  if isinstance(x, str):
    return str.__str__(x)
  if isinstance(x, list):
    return [encode(e, d) for e in list.__iter__(x)]
  if isinstance(x, tuple):
    return {"__tuple__": [encode(e, d) for e in tuple.__iter__(x)]}
  if isinstance(x, dict):
    return {"__dict__": [[encode(k, d), encode(v, d)] for k, v in dict.items(x)]}
  if isinstance(x, frozenset):
    return {"__frozenset__": [encode(e, d) for e in frozenset.__iter__(x)]}
  if isinstance(x, set):
    return {"__set__": [encode(e, d) for e in set.__iter__(x)]}
  if isinstance(x, (bytes, bytearray)):
    return {"__bytes__": bytes(x).hex()}
  if isinstance(x, complex):
    return {"__complex__": [encode(complex.__complex__(x).real), encode(complex.__complex__(x).imag)]}
  return {"__opaque__": f"{type(x).__module__}.{type(x).__qualname__}"}


def decode(x, depth=0):
  """Tagged data -> plain Python values (S side; strict, raises ValueError)."""
  if depth > MAX_DEPTH:
    raise ValueError("value nested too deeply")
  d = depth + 1
  if x is None or type(x) in (bool, int, float, str):
    return x
  if type(x) is list:
    return [decode(e, d) for e in x]
  if type(x) is not dict or len(x) != 1 or next(iter(x)) not in TAGS:
    raise ValueError(f"malformed value of type {type(x).__name__}")
  (tag, v), = x.items()
  if tag == "__opaque__":
    return Opaque(str(v))
  if tag == "__bigint__":
    return int(v, 16)
  if tag == "__float__":
    if v not in ("nan", "inf", "-inf"):
      raise ValueError(f"bad float {v!r}")
    return float(v)
  if tag == "__bytes__":
    return bytes.fromhex(v)
  if tag == "__complex__":
    return complex(float(v[0]), float(v[1]))
  if type(v) is not list:
    raise ValueError(f"malformed {tag}")
  if tag == "__dict__":
    return {decode(k, d): decode(e, d) for k, e in v}
  items = [decode(e, d) for e in v]
  return {"__tuple__": tuple, "__set__": set, "__frozenset__": frozenset}[tag](items)


# ----------------------------------------------------------------------------- framing
def send(fd, obj):
  data = json.dumps(obj, allow_nan=False).encode()
  view = memoryview(struct.pack(">I", len(data)) + data)
  while view:  # a memoryview: slicing does not copy (32 MiB of output stays linear)
    view = view[os.write(fd, view):]


def _read_exact(fd, n, deadline):
  chunks, got = [], 0
  while got < n:
    if deadline is not None:
      left = deadline - time.monotonic()
      if left <= 0 or not select.select([fd], [], [], left)[0]:
        raise TimeoutError("timed out")
    chunk = os.read(fd, min(n - got, 1 << 20))
    if not chunk:
      raise EOFError("channel closed")
    chunks.append(chunk)
    got += len(chunk)
  return b"".join(chunks)


def recv(fd, deadline=None, max_bytes=1 << 26):
  (n,) = struct.unpack(">I", _read_exact(fd, 4, deadline))
  if n > max_bytes:
    raise ValueError(f"message of {n} bytes exceeds the cap of {max_bytes}")
  return json.loads(_read_exact(fd, n, deadline))


# ----------------------------------------------------------------------------- bounded repr
def brief(x, limit=200):
  """``repr(x)`` cut to about ``limit`` characters, in time linear in ``limit``.

  Unlike ``repr(x)[:limit]`` it never builds the whole repr: a huge int is shown by its
  size (decimal conversion is quadratic: 6 million digits take minutes), a long list or
  string is cut before it is formatted.
  """
  out, left = [], [limit]

  def emit(s):
    out.append(s[:max(left[0], 0)])
    left[0] -= len(s)

  def walk(v, depth):
    if left[0] <= 0:
      return
    if isinstance(v, int) and not isinstance(v, bool) and v.bit_length() > BIG_INT_BITS:
      emit(f"<int of {v.bit_length()} bits>")
    elif isinstance(v, (str, bytes, bytearray)):
      emit(repr(v[:left[0] + 1]))
    elif isinstance(v, (list, tuple, set, frozenset, dict)):
      if depth >= MAX_DEPTH:
        emit("...")
        return
      opener, closer = {list: "[]", tuple: "()"}.get(type(v), "{}")
      emit(opener)
      for i, item in enumerate(v.items() if isinstance(v, dict) else v):
        if left[0] <= 0:
          break
        if i:
          emit(", ")
        if isinstance(v, dict):
          walk(item[0], depth + 1)
          emit(": ")
          walk(item[1], depth + 1)
        else:
          walk(item, depth + 1)
      emit(closer)
    else:
      emit(repr(v)[:left[0] + 1])

  walk(x, 0)
  return "".join(out)
