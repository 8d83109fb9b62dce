"""Where a jitted call's time goes on XLA:CPU: per-op wall time from the jax profiler.

XLA:CPU runs a compiled program as a sequence of *thunks* (one per fusion, library call or
copy). With `--xla_cpu_enable_xprof_traceme=true` in XLA_FLAGS (set before jax starts) each
thunk leaves a trace event named after its HLO instruction. `op_table` traces one run,
matches every event to its instruction in the optimized HLO and sums the time by the
instruction's source `op_name` with layer indices and segment copies folded together, so
"attn/bkmd,bkds->bkms/dot_general" collects the scores matmul of every layer.

Used by `benchmarks/sampler.py --profile`; figures are per run, divided by `per` (e.g.
decode steps) when given. jax is imported lazily, so `enable_thunk_tracing` can run first.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import tempfile

TRACEME_FLAG = "--xla_cpu_enable_xprof_traceme=true"


def enable_thunk_tracing() -> None:
  """Adds the per-thunk trace flag to XLA_FLAGS; must run before jax creates its backend."""
  flags = os.environ.get("XLA_FLAGS", "")
  if TRACEME_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {TRACEME_FLAG}".strip()


def _instruction_op_names(hlo_text: str) -> dict[str, str]:
  """HLO instruction name -> its op_name metadata ('' when it has none)."""
  out = {}
  for m in re.finditer(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$", hlo_text, re.M):
    op = re.search(r'op_name="([^"]*)"', m.group(2))
    out[m.group(1)] = op.group(1) if op else ""
  return out


def _fold(op_name: str) -> str:
  op_name = re.sub(r"^jit\([^)]*\)/", "", op_name)
  return re.sub(r"layers_\d+/", "", op_name)


def op_table(run, hlo_text: str, *, per: float = 1.0, top: int = 20) -> list[tuple[float, str, str]]:
  """Traces one `run()` (already compiled and warm) of the program whose optimized HLO is
  `hlo_text` (e.g. `lowered.compile().as_text()`) and returns up to `top` rows (ms per `per`,
  thunk kind, folded op_name), largest first, plus a 'total' row.

  Raises:
    RuntimeError: the trace holds no thunk events (XLA_FLAGS lacked TRACEME_FLAG when jax
      started, or the backend is not XLA:CPU).
  """
  import jax
  names = _instruction_op_names(hlo_text)
  with tempfile.TemporaryDirectory() as tmp:
    with jax.profiler.trace(tmp, create_perfetto_trace=True):
      jax.block_until_ready(run())
    files = glob.glob(os.path.join(tmp, "**", "*.trace.json.gz"), recursive=True)
    if not files:
      raise RuntimeError(f"jax.profiler wrote no perfetto trace under {tmp}")
    events = json.load(gzip.open(files[0]))["traceEvents"]
  sums = collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") != "X" or name not in names:
      continue
    kind = re.sub(r"\.\d+$", "", name)
    sums[(kind, _fold(names[name]) or name)] += e["dur"] / 1e3 / per
  if not sums:
    raise RuntimeError("no XLA:CPU thunk events in the trace: start the process with "
                       f"XLA_FLAGS containing {TRACEME_FLAG} (see enable_thunk_tracing)")
  rows = [(ms, kind, op) for (kind, op), ms in sums.most_common(top)]
  rows.append((sum(sums.values()), "total", "all thunks"))
  return rows


def format_table(rows) -> str:
  return "\n".join(f"{ms:9.3f}  {kind:36s} {op}" for ms, kind, op in rows)
