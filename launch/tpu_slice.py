"""A Cloud TPU slice as XLA:TPU sees it, on a machine without a TPU (`launch/check.py --topology`).

libtpu's ahead-of-time compiler runs on any host: `jax.experimental.topologies.get_topology_desc`
gives a slice's devices (`platform="tpu"`, a libtpu topology name such as "v5p:2x2x1"), a mesh
over them takes shardings as on the pod, and `jit(...).lower(...).compile()` is XLA:TPU's own
compile, with its own buffer assignment and `memory_analysis()`. This is how MaxText's
`train_compile.py` checks pod programs from a CPU machine.

This module turns Cloud TPU's slice names into those topologies and reads what the check needs
from the compiler, not from a hand table:

  * devices, chips, hosts and the chip kind: the topology's devices (`device_kind`, `coords`,
    `process_index`);
  * HBM per device: what XLA:TPU says is available to a program. A probe program whose argument
    cannot fit is compiled; the compiler refuses it with "... exceeds available HBM (95.74G)"
    and that figure (GiB: XLA prints byte counts in powers of 1,024) is the budget.

Slice names (Cloud TPU's): for v4 and v5p the number counts TensorCores, two per chip (v5p-8 is 4
chips on one host, v5p-32 is 16 chips on 4 hosts); for v5e (v5litepod) and v6e it counts chips.
A libtpu topology name ("v5p:2x2x4") is accepted as well; "v5p-2" / "v5e-1" / "v6e-1" give one
chip (a host bounded to one chip). libtpu is the `tpu` extra: `pip install -e ".[tpu]"`.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re

INSTALL_HINT = ('pip install -e ".[tpu]"  (libtpu, the version the installed jax pins; '
                'it compiles for TPU on any machine, no TPU needed)')

# Generations: (libtpu name, TensorCores counted per chip in the slice name, torus dimensions).
_GENERATIONS = {"v4": ("v4", 2, 3), "v5p": ("v5p", 2, 3), "v5e": ("v5e", 1, 2),
                "v5litepod": ("v5e", 1, 2), "v6e": ("v6e", 1, 2)}


class SliceError(ValueError):
  """A slice name that names no TPU slice, or libtpu missing."""


@dataclasses.dataclass(frozen=True)
class Slice:
  """A TPU slice's devices as XLA:TPU compiles for them.

  Attributes:
    name: the name asked for (e.g. "v5p-8").
    topology: the libtpu topology name (e.g. "v5p:2x2x1").
    devices: the slice's devices (compile-only: no buffers live on them).
    kind: the devices' `device_kind` (e.g. "TPU v5").
    chips: distinct chips (device coordinates).
    hosts: distinct processes (one per host on the pod).
    hbm_bytes: HBM per device available to a program, as XLA:TPU reports it.
  """
  name: str
  topology: str
  devices: tuple
  kind: str
  chips: int
  hosts: int
  hbm_bytes: int

  def describe(self) -> str:
    per = "chip" if len(self.devices) == self.chips else "device (TensorCore)"
    return (f"{self.name} (libtpu topology {self.topology}): {len(self.devices)} devices, "
            f"{self.chips} chips of {self.kind} on {self.hosts} host(s), "
            f"{self.hbm_bytes / 2**30:.2f} GiB HBM per {per} (XLA:TPU's figure)")


def _torus(chips: int, dims: int) -> list[int]:
  """Cloud TPU's default torus shape for `chips` chips: 2x2x1, 2x2x2, 2x2x4, 2x4x4, 4x4x4, ...
  (3D, v4 / v5p) or 1x1, 2x2, 2x4, 4x4, 4x8, 8x8, ... (2D, v5e / v6e)."""
  if chips < 1 or chips & (chips - 1):
    raise SliceError(f"{chips} chips: a Cloud TPU slice (--topology) holds a power of two of "
                     "chips")
  shape = [1] * dims
  while math.prod(shape) < chips:
    if dims == 3 and shape[0] * shape[1] < 4:   # the first 4 chips fill one host's 2x2 plane
      shape[0 if shape[0] <= shape[1] else 1] *= 2
      continue
    smallest = min(shape)
    last = max(i for i, s in enumerate(shape) if s == smallest)   # ties: the last axis doubles
    shape[last] *= 2
  return shape


def topology_name(name: str) -> tuple[str, dict]:
  """Cloud TPU slice name -> (libtpu topology name, extra get_topology_desc arguments)."""
  if ":" in name:  # already a libtpu topology name
    gen, _, shape = name.partition(":")
    dims = [int(x) for x in shape.split("x")] if re.fullmatch(r"\d+(x\d+)*", shape) else []
    if gen not in {g for g, _, _ in _GENERATIONS.values()} or not dims:
      raise SliceError(f"--topology={name!r}: expected e.g. 'v5p:2x2x1'")
    return name, ({"chips_per_host_bounds": (1,) * 3} if math.prod(dims) == 1 else {})
  m = re.fullmatch(r"(v4|v5p|v5e|v5litepod|v6e)-(\d+)", name.strip().lower())
  if not m:
    raise SliceError(f"--topology={name!r}: expected a Cloud TPU slice name such as v5p-8, "
                     "v5p-32, v5e-16, v6e-8, v4-8 (or a libtpu topology such as v5p:2x2x1)")
  gen, per_chip, dims = _GENERATIONS[m.group(1)]
  count = int(m.group(2))
  if count % per_chip:
    raise SliceError(f"--topology={name!r}: {gen} slice names count TensorCores, {per_chip} per "
                     "chip; the number must be even")
  chips = count // per_chip
  shape = _torus(chips, dims)
  extra = {"chips_per_host_bounds": (1,) * 3} if chips == 1 else {}
  return f"{gen}:{'x'.join(map(str, shape))}", extra


def require_libtpu() -> None:
  """Raises SliceError with the install line when libtpu (XLA:TPU) is not importable."""
  try:
    import libtpu  # noqa: F401  pylint: disable=import-outside-toplevel,unused-import
  except ImportError as e:
    raise SliceError(f"--topology needs libtpu (XLA:TPU's compiler), which is not installed: "
                     f"{INSTALL_HINT}") from e


def probe_hbm_bytes(devices) -> int:
  """HBM per device available to a program, read from XLA:TPU: compile a program whose argument
  is 2 TiB per device and parse the figure of the compiler's refusal."""
  import jax  # pylint: disable=import-outside-toplevel
  import jax.numpy as jnp  # pylint: disable=import-outside-toplevel
  import numpy as np  # pylint: disable=import-outside-toplevel
  from jax.sharding import Mesh, NamedSharding, PartitionSpec as P  # pylint: disable=import-outside-toplevel
  mesh = Mesh(np.asarray(devices[:1]), ("x",))
  arg = jax.ShapeDtypeStruct((2**41,), jnp.int8, sharding=NamedSharding(mesh, P()))
  try:
    jax.jit(lambda x: jnp.sum(x, dtype=jnp.int32)).lower(arg).compile()
  except Exception as e:  # pylint: disable=broad-except
    found = re.search(r"available HBM \(([\d.]+)([KMGT]?)\)", str(e))
    if found:
      return int(float(found.group(1)) * 1024 ** "_KMGT".index(found.group(2) or "_"))
    raise RuntimeError(f"could not read the available HBM from XLA:TPU's error: {e}") from e
  raise RuntimeError("XLA:TPU compiled a 2 TiB argument: cannot read the available HBM")


def topology(name: str) -> Slice:
  """The slice `name` as XLA:TPU compiles for it (libtpu required; no TPU needed)."""
  require_libtpu()
  # Compile-only use holds no TPU, so libtpu's one-process-per-host lock (/tmp/libtpu_lockfile)
  # guards nothing here; without this, two checks (or test workers) at once refuse each other.
  os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
  from jax.experimental import topologies  # pylint: disable=import-outside-toplevel
  topo, extra = topology_name(name)
  try:
    devices = tuple(topologies.get_topology_desc(platform="tpu", topology_name=topo,
                                                 **extra).devices)
  except Exception as e:  # pylint: disable=broad-except
    raise SliceError(f"--topology={name!r}: libtpu has no topology {topo!r}: {e}") from e
  chips = len({tuple(d.coords) for d in devices})
  hosts = len({d.process_index for d in devices})
  return Slice(name=name, topology=topo, devices=devices, kind=devices[0].device_kind,
               chips=chips, hosts=hosts, hbm_bytes=probe_hbm_bytes(devices))
