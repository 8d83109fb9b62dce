"""Capabilities of the code sandbox on this machine, and the per-run harness config (host side).

Used by ``runs`` (``SandboxCapabilities`` and ``sandbox_capabilities`` are exported by the
package). The probe runs the real harness (``harness.probe``) once per
config and mode; ``plan`` turns a missing layer into a ``SandboxError`` unless the config
relaxes it.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import site
import socket
import sys
import sysconfig
import tempfile

from mr_rl.rewards.sandbox import cgroups, seccomp
from mr_rl.rewards.sandbox.host import SandboxError, launch, rmtree


@dataclasses.dataclass(frozen=True)
class SandboxCapabilities:
  """What isolation ``run`` gets on this machine (from a live probe).

  Attributes:
    is_root: the caller is root.
    namespaces: "root" (as root, with a user namespace mapping only the sandbox uid),
      "user" (unprivileged user namespace) or None (no namespaces: no network / pid / IPC /
      /tmp isolation, and the host is writable wherever the uid may write).
    network_isolated: a connect to a listener on the host's 127.0.0.1 failed.
    pid_namespace: the run's processes die with its zygote (pid 1).
    ipc_namespace: SysV / POSIX IPC objects are private to the run.
    private_tmp: /tmp, /var/tmp, /dev/shm are private to the run.
    private_proc: /proc inside shows only the run's processes.
    read_only_host: every mount but the private tmpfs and /proc is read-only inside.
    memory_cgroup: 1 or 2 (the cgroup version bounding a whole run's memory) or None.
    cpu_cgroup: 1 or 2 (the cgroup version bounding a whole run's CPU time) or None.
    seccomp: the syscall filter is installed (and no_new_privs set) before candidate code.
    privilege_drop: the candidate runs as an unprivileged uid (root only): a slot's own from
      ``SandboxConfig.uid_range``, or ``SandboxConfig.uid``.
    capabilities_left: capability sets (name, mask) still non-empty after the drop; empty
      wherever the probe ran (``run`` refuses otherwise).
    stdlib_readable: the sandboxed interpreter could import a stdlib module.
    notes: consequences of what is missing, in words.
  """
  is_root: bool
  namespaces: str | None
  network_isolated: bool
  pid_namespace: bool
  ipc_namespace: bool
  private_tmp: bool
  private_proc: bool
  read_only_host: bool
  memory_cgroup: int | None
  cpu_cgroup: int | None
  seccomp: bool
  privilege_drop: bool
  capabilities_left: tuple[tuple[str, int], ...]
  stdlib_readable: bool
  notes: tuple[str, ...]


def _site_dirs():
  """This interpreter's site-packages / dist-packages (installed packages and their data)."""
  paths = set(site.getsitepackages()) | {sysconfig.get_path(k) for k in ("purelib", "platlib")}
  return sorted(os.path.realpath(p) for p in paths if p and os.path.isdir(p))


def harness_cfg(config, role, namespaces, drop, workdir, limits=None, uid=None):
  """The harness's config for one run or probe, as ``uid`` (default ``config.uid``)."""
  prefixes = sorted({os.path.realpath(p) for p in (sys.base_prefix, sys.base_exec_prefix,
                                                   os.path.dirname(os.path.realpath(config.python)))})
  hide = sorted({os.path.realpath(p) for p in config.hidden_paths} | set(_site_dirs()))
  uid = config.uid if uid is None else uid
  return {"role": role, "namespaces": namespaces, "drop": drop, "uid": uid, "gid": config.gid,
          "workdir": workdir, "expose": prefixes, "hide": hide, "tmpfs_bytes": config.tmpfs_bytes,
          "max_ptys": config.max_ptys,
          "visible": list(config.visible_paths), "limits": limits,
          "executable": os.path.realpath(config.python)}


def make_workdir(config, drop, uid=None):
  workdir = tempfile.mkdtemp(prefix="mr_rl_sandbox_")
  os.chmod(workdir, 0o700)
  if drop:
    os.chown(workdir, config.uid if uid is None else uid, config.gid)
  return workdir


def slot_uids(config, drop):
  """The (first, count) range each fork server claims its uid from, or None (every slot
  runs as ``config.uid``: no uid drop, or ``uid_range=None``)."""
  return tuple(config.uid_range) if drop and config.uid_range else None


# ----------------------------------------------------------------------------- capabilities
@functools.lru_cache(maxsize=2)
def _cgroup_parent(controller):
  return cgroups.find_cgroup(controller)


def cgroup_spec(config):
  """The fork server's cgroups for ``config`` (``{"dirs": [[version, parent, settings]]}``,
  for ``cgroups.cgroup_enter``) or None.

  CPU: a quota of ``cpus`` per 100 ms period, and with it a scheduler group of its own: a run
  whose processes each call ``setsid`` no longer gets one scheduler autogroup (one fair
  share) per process, since autogroups apply only to tasks of the root CPU cgroup.
  """
  dirs = {}
  version, parent = _cgroup_parent("memory")
  if config.memory_limit == "cgroup" and version is not None:
    limit = config.memory_bytes
    dirs[parent] = [version, parent, {"memory.max": limit, "?memory.swap.max": 0} if version == 2 else
                    {"memory.limit_in_bytes": limit, "?memory.memsw.limit_in_bytes": limit}]
  version, parent = _cgroup_parent("cpu")
  if config.cpus is not None and version is not None:
    period = 100_000
    quota = max(1000, int(config.cpus * period))
    settings = ({"cpu.max": f"{quota} {period}"} if version == 2 else
                {"cpu.cfs_period_us": period, "cpu.cfs_quota_us": quota})
    dirs.setdefault(parent, [version, parent, {}])[2].update(settings)
  version, parent = _io_parent()
  if (config.io_bps or config.io_iops) and version is not None:
    dirs.setdefault(parent, [version, parent, {}])[2].update(_io_settings(config, version))
  return {"dirs": list(dirs.values())} if dirs else None


def _io_parent():
  """(version, parent) of the io (v2) or blkio (v1) hierarchy, or (None, why)."""
  version, parent = _cgroup_parent("io")
  if version != 2:
    version, parent = _cgroup_parent("blkio")
    if version == 2:  # (v2 has no controller of that name)
      return None, "no io controller"
  return version, parent


def _disks():
  """MAJ:MIN of every whole disk with a size (throttling is set per disk)."""
  out = []
  for name in sorted(os.listdir("/sys/block")):
    try:
      with open(f"/sys/block/{name}/size") as f:
        if int(f.read()) == 0:
          continue
      with open(f"/sys/block/{name}/dev") as f:
        out.append(f.read().strip())
    except (OSError, ValueError):
      continue
  return out


def _io_settings(config, version):
  bps, iops, disks = config.io_bps, config.io_iops, _disks()
  if version == 2:
    v = lambda x: "max" if x is None else x
    return {"io.max": [f"{d} rbps={v(bps)} wbps={v(bps)} riops={v(iops)} wiops={v(iops)}"
                       for d in disks]}
  out = {}
  for kind, value in (("bps", bps), ("iops", iops)):
    if value is not None:
      for op in ("read", "write"):
        out[f"blkio.throttle.{op}_{kind}_device"] = [f"{d} {value}" for d in disks]
  return out


def _probe(config, namespaces, drop):
  from mr_rl.rewards.sandbox import uids  # pylint: disable=import-outside-toplevel
  slots = slot_uids(config, drop)
  lease = uids.claim(*slots) if slots else None  # the probe takes a slot's uid too
  uid = lease.uid if lease else config.uid
  with socket.socket() as listener:
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    workdir = make_workdir(config, drop, uid)
    try:
      cfg = harness_cfg(config, "probe", namespaces, drop, workdir, uid=uid)
      cfg.update(probe_port=listener.getsockname()[1], host_ipc_ns=os.readlink("/proc/self/ns/ipc"),
                 cgroup=cgroup_spec(config))
      out, err, timed_out, _ = launch(config, cfg, b"", 30.0, workdir, "/tmp" if namespaces else workdir)
    finally:
      rmtree(workdir)
      if lease is not None:
        lease.release()
    try:
      listener.accept()[0].close()
      reached_host = True
    except BlockingIOError:
      reached_host = False
  if timed_out or not out:
    raise SandboxError(f"sandbox probe produced no report (stderr: {err.decode(errors='replace')[-500:]})")
  report = json.loads(out)
  report["network_blocked"] = report.get("network_blocked", False) and not reached_host
  report["expected_uid"] = uid
  return report


_WRITABLE_INSIDE = {"/tmp", "/var/tmp", "/dev/shm", "/proc", "/dev/pts"}  # all private


@functools.lru_cache(maxsize=8)
def capabilities(config) -> SandboxCapabilities:
  """``sandbox_capabilities`` for a given ``SandboxConfig`` (cached per config)."""
  is_root = os.geteuid() == 0
  attempts = [("root", True), (None, True)] if is_root else [("user", False), (None, False)]
  report, failed = None, []
  for namespaces, drop in attempts:
    report = _probe(config, namespaces, drop)
    if report.get("namespaces") == namespaces and not report.get("error"):
      break
    failed.append(f"{namespaces}: {report.get('error')}")
  ns = report.get("namespaces") if not report.get("error") else None
  writable = set(report.get("writable_mounts") or ["/"])
  caps = dict(is_root=is_root, namespaces=ns, network_isolated=bool(report.get("network_blocked")),
              pid_namespace=ns is not None, ipc_namespace=bool(ns and report.get("ipc_namespace")),
              private_tmp=ns is not None, private_proc=bool(report.get("private_proc")),
              read_only_host=bool(ns) and writable <= _WRITABLE_INSIDE,
              memory_cgroup=report.get("memory_cgroup"), cpu_cgroup=report.get("cpu_cgroup"),
              seccomp=bool(report.get("seccomp") and report.get("no_new_privs")),
              privilege_drop=is_root and report.get("uid") == report["expected_uid"],
              capabilities_left=tuple(sorted((report.get("capabilities") or {}).items())),
              stdlib_readable=bool(report.get("stdlib_readable")))
  notes = []
  if not is_root:
    notes.append("not root: programs run as the calling user (no uid drop), and no memory cgroup")
  if ns is None:
    notes.append(f"no namespaces ({'; '.join(failed)}; user namespaces and Linux >= 5.12 are "
                 "needed): network reachable, /tmp and IPC shared with the host, the host "
                 "writable, and processes that leave the process group (setsid) survive the run")
  elif not caps["read_only_host"]:
    notes.append(f"host mounts left writable inside: {sorted(writable - _WRITABLE_INSIDE)}")
  if caps["memory_cgroup"] is None:
    why = report.get("cgroup_error") or _cgroup_parent("memory")[1]
    why = why if config.memory_limit == "cgroup" else "memory_limit='per-process'"
    notes.append(f"no memory cgroup ({why}): memory_bytes holds per process, so a run can hold "
                 "memory_bytes * max_processes plus tmpfs_bytes of files")
  if caps["cpu_cgroup"] is None:
    why = report.get("cgroup_error") or _cgroup_parent("cpu")[1]
    why = why if config.cpus is not None else "cpus=None"
    notes.append(f"no CPU cgroup ({why}): a run's processes take CPU like any others, and where "
                 "scheduler autogroups are on, each process that calls setsid gets a share of its own")
  if not caps["seccomp"]:
    arch = seccomp.ARCH
    table = "supported" if arch in seccomp.SYSCALLS else "no syscall table"
    notes.append(f"no syscall filter (arch {arch}: {table}; "
                 f"{report.get('child_error') or 'filter not active'}); without a table the "
                 "trainer's session keyring is not replaced either")
  if not caps["stdlib_readable"]:
    notes.append(f"the sandbox cannot import the standard library ({report.get('child_error')})")
  return SandboxCapabilities(notes=tuple(notes), **caps)


def plan(config):
  """The capabilities, or SandboxError for a layer ``config`` requires and the machine lacks."""
  caps = capabilities(config)
  if caps.capabilities_left:  # never expected: a bug or an unusual kernel, not a policy choice
    raise SandboxError(f"the sandboxed program would keep capabilities {caps.capabilities_left}")
  if not caps.stdlib_readable:
    raise SandboxError(f"sandboxed interpreter unusable: {caps.notes}")
  if config.require_network_isolation and not caps.network_isolated:
    raise SandboxError(f"no network isolation on this machine ({caps.notes}); "
                       "set SandboxConfig(require_network_isolation=False) to run without it")
  if config.require_privilege_drop and not caps.privilege_drop:
    raise SandboxError(f"cannot run programs as an unprivileged uid ({caps.notes}); "
                       "set SandboxConfig(require_privilege_drop=False) to run as the caller")
  if config.memory_limit == "cgroup" and caps.memory_cgroup is None:
    raise SandboxError(f"no memory cgroup for a whole-run memory limit ({caps.notes}); set "
                       "SandboxConfig(memory_limit='per-process') to bound each process only")
  if config.cpus is not None and caps.cpu_cgroup is None:
    raise SandboxError(f"no CPU cgroup for a whole-run CPU quota ({caps.notes}); set "
                       "SandboxConfig(cpus=None) to run without one")
  if (config.io_bps or config.io_iops) and _io_parent()[0] is None:
    raise SandboxError(f"no io (v2) or blkio (v1) cgroup for a run's disk I/O cap "
                       f"({_io_parent()[1]}); set SandboxConfig(io_bps=None, io_iops=None) to "
                       "run without one")
  if config.require_seccomp and not caps.seccomp:
    raise SandboxError(f"no syscall filter on this machine ({caps.notes}); "
                       "set SandboxConfig(require_seccomp=False) to run without it")
  return caps
