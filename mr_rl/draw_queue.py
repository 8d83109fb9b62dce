"""The queue of a run's draws between sampler and learner (`DrawQueue`). Every run's loop goes
through it; with `asynchrony.max_staleness = 0` it holds one draw at a time (issue 26;
docs/architecture.md "The draw queue").

A *draw* is one step's sampled and scored groups, and a policy's *version* the number of
updates applied to it (the learner is at version t when step t starts). Draws are submitted
and taken in step order: at step t, before its update, the trainer submits the draw of step
t + s with the current policy (version t) and takes the draw of step t, sampled by version
max(0, t - s). The schedule is fixed, so a resumed run equals an uninterrupted one:

    step t:  submit draw t+s (version t) -> take draw t -> signal -> batch -> update -> push

For every run the queue:

* submits and takes the draws (`fill`, `take`); at s = 0 draw t is submitted and taken at
  once, on the main thread, with nothing else in flight (the synchronous loop).
* overlaps scoring with the update when a draw is in flight beside it (the asynchronous mode;
  at s = 0 a draw is scored before it is taken): the reward scoring of the draw just sampled
  (host threads, process pools) runs on a worker thread while the main thread signals and
  updates the previous draw (`score_later`). The batch-level rules of the rewards (the rows
  gathered over processes, applicability per prompt, the failure guards:
  `mr_rl.rollout.StreamingScore.finish`) run on the main thread when the draw is taken, in
  submission order, so the guards count the same consecutive batches as without overlap.
* owns the params the sampler draws with: after every update the trainer pushes the
  learner's policy (`push`; on split devices a copy, timed as `time/weight_push`).
* writes the draws in flight next to each checkpoint (`save`, host numpy values in
  WORKDIR/inflight/<step>.p<process>.pkl; none at s = 0) and restores them with it
  (`restore`), so the resumed run consumes the very groups the uninterrupted one would have.

The asynchronous mode (`AsyncSettings`, `config.asynchrony`; `active`) is one part of it:

* bounded staleness (`max_staleness = s > 0`): `StaleQueue.take` never hands out a draw
  sampled more than `s` versions before the learner's; such a draw is dropped
  (`async/stale_dropped`) and the trainer samples afresh.
* split devices (`sampler_devices = n > 0`): the first n devices sample, the rest learn
  (`split_devices`); each draw (sampling and scoring) runs on the worker thread with the
  sampler's own copy of the weights, which the push refreshes (`push_params`).
* ordered dispatch, split devices over several processes: each process gives the same number
  of its devices to each side (`split_devices`) and the push copies within each process.
  Programs of a multi-process job must start in the same order on every process, which two
  threads dispatching at will do not guarantee (on XLA:CPU with gloo, two threads running
  cross-process programs on disjoint device sets hang within a few hundred steps). So every
  device program is dispatched from the main thread: the draws of later steps are deferred
  (`fill`) and started right after the step's update is dispatched (`draw_deferred`), and
  since jax dispatches asynchronously the learner's devices run the update while the main
  thread drives the sampler's devices; scoring waits on the worker as on one device set.

Metrics (only in the asynchronous mode, so a synchronous run logs what it always did):
`async/staleness` (learner version minus the consumed draw's), `async/in_flight`,
`async/stale_dropped`, `time/reward_wait` (the part of the scoring the main thread waited
for), `time/weight_push`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import glob
import os
import pickle
import time
from typing import Any, Callable, ClassVar, Iterable, Sequence

import jax

from mr_rl import fields, rollout as rollout_lib
from mr_rl.models import lora as lora_lib, sharding


@dataclasses.dataclass(frozen=True)
class AsyncSettings:
  """How far the sampler may run ahead of the learner, `config.asynchrony` (fields declared
  with `mr_rl.fields.setting` and checked here)."""
  SECTION: ClassVar[str] = "asynchrony"
  max_staleness: int = fields.setting(
      0, "s: groups sampled up to s updates ago (0 = the synchronous loop)", fields.Int(lo=0))
  sampler_devices: int = fields.setting(
      0, "devices for the sampler, the rest learn (0 = both share all devices, alternating)",
      fields.Int(lo=0))

  def __post_init__(self):
    fields.validate(self)

  @property
  def active(self) -> bool:
    """Whether the run differs from the synchronous loop (metrics, worker thread)."""
    return self.max_staleness > 0 or self.sampler_devices > 0


def split_devices(devices: Sequence[Any], sampler_devices: int) -> tuple[list, list]:
  """(sampler devices, learner devices), disjoint: each process gives its first
  `sampler_devices / process count` devices (of `devices`, in order) to the sampler and the rest
  to the learner, so both sets span every process (with one process: the first
  `sampler_devices` and the rest).

  Raises:
    ValueError: the split leaves either side without a device, or does not divide evenly
      over the processes.
  """
  devices = list(devices)
  process_of = lambda d: getattr(d, "process_index", 0)  # (the timeline model passes ints)
  processes = sorted({process_of(d) for d in devices}) or [0]
  per = {p: [d for d in devices if process_of(d) == p] for p in processes}
  if sampler_devices % len(processes):
    raise ValueError(f"config.asynchrony.sampler_devices={sampler_devices} must be a multiple of "
                     f"the process count {len(processes)} (each process gives the sampler the "
                     "same number of its devices)")
  k = sampler_devices // len(processes)
  if not 0 < k < min(len(v) for v in per.values()):
    raise ValueError(f"config.asynchrony.sampler_devices={sampler_devices} must leave devices to "
                     f"both the sampler and the learner; this run has {len(devices)}"
                     + (f" ({len(devices) // len(processes)} per process)"
                        if len(processes) > 1 else ""))
  return ([d for p in processes for d in per[p][:k]],
          [d for p in processes for d in per[p][k:]])


def split_meshes(mesh_sizes, sampler_devices: int):
  """(sampler mesh, learner mesh) over disjoint devices (`split_devices`): the learner's
  follows `config.mesh`, the sampler's decodes data-parallel with the same tensor split."""
  sampler, learner = split_devices(jax.devices(), sampler_devices)
  return (sharding.make_mesh({"data": -1, "tensor": mesh_sizes["tensor"]}, devices=sampler),
          sharding.make_mesh(dict(mesh_sizes), devices=learner))


@functools.lru_cache(maxsize=4)
def _replicate(mesh):
  """A jitted identity whose outputs are whole on every device of `mesh` (compiled once)."""
  return jax.jit(lambda tree: tree, out_shardings=jax.sharding.NamedSharding(
      mesh, jax.sharding.PartitionSpec()))


def push_params(params, shardings, learner_mesh):
  """`params` (on `learner_mesh`'s devices) copied to the sampler's `shardings`.

  One process: `jax.device_put` (device to device). Several: a device_put between disjoint
  device sets spanning several processes is not supported outside TPU runtimes (jax raises
  "cross-host reshard ... should have the same set of devices"), and each process can only
  write its own devices. So the params are first made whole on every learner device (an
  all-gather among the learner's devices: a no-op for params the learner already replicates,
  e.g. data-parallel), then each process copies, device to device within the process, the
  slice each of its sampler devices holds. Costs a full copy of the params per learner device
  while it runs.
  """
  if jax.process_count() == 1:
    return jax.device_put(params, shardings)
  whole = _replicate(learner_mesh)(params)

  def leaf(x, s):
    local = x.addressable_data(0)  # all of x, on one of this process's learner devices
    shards = [jax.device_put(local[index], d)
              for d, index in s.addressable_devices_indices_map(x.shape).items()]
    return jax.make_array_from_single_device_arrays(x.shape, s, shards)

  return jax.tree.map(leaf, whole, shardings)


@dataclasses.dataclass(frozen=True)
class StepTimes:
  """Measured seconds of one RL step's parts, on all N devices of one set (`timeline`).

  Attributes:
    rollout: sampling the step's batch (with scoring started row by row as rows finish).
    score: the host-side scoring still running when the rollout ends (its tail).
    update: signal, batch and update (what the main thread does after taking a draw).
    push: copying the updated weights to the sampler's devices (split only).
  """
  rollout: float
  score: float
  update: float
  push: float = 0.0


def timeline(t: StepTimes, devices: int, sampler_devices: int = 0,
             max_staleness: int = 0) -> float:
  """Predicted steps/s in steady state of the schedule in the module docstring.

  One device set (`sampler_devices = 0`): sampling and updates alternate on the devices, so
  a step costs rollout + update; at s = 0 the scoring tail adds to it, at s >= 1 it runs on
  the worker thread during the next rollout and update, so it only bounds the step from
  below (one worker waits on one draw's scoring at a time):

      s = 0: T = rollout + score + update          s >= 1: T = max(rollout + update, score)

  Split (n of N devices sample, the rest learn): the parts scale by the share of devices
  (rollout' = rollout N / n, update' = update N / (N - n): an ideal, linear scaling; the
  caller feeds measured times when it has them). The worker thread draws (rollout' + score),
  the main thread updates and pushes (update' + push); at s >= 1 they run side by side:

      s = 0: T = rollout' + score + update' + push   s >= 1: T = max(rollout' + score,
                                                                    update' + push)

  Returns 1 / T. Raises ValueError on a split that leaves a side without devices.
  """
  if sampler_devices:
    split_devices(range(devices), sampler_devices)  # (the same check as a run's)
    draw = t.rollout * devices / sampler_devices + t.score
    learn = t.update * devices / (devices - sampler_devices) + t.push
    period = max(draw, learn) if max_staleness else draw + learn
  else:
    period = (max(t.rollout + t.update, t.score) if max_staleness
              else t.rollout + t.score + t.update)
  return 1.0 / period


@dataclasses.dataclass
class InFlight:
  """A draw on its way: for step `step`, sampled by policy version `version`.

  `call` is the sampling not started yet (split devices over several processes: it runs
  when `DrawQueue.draw_deferred` or `resolve` calls it), `job` its unfinished part (a future,
  or None once finished) and `finish` turns the job's value into the draw on the main thread;
  `draw` is set once finished.
  """
  step: int
  version: int
  job: Any = None
  finish: Callable[[Any], Any] | None = None
  draw: Any = None
  wait_s: float = 0.0
  call: Callable[[], Any] | None = None

  def start(self) -> None:
    """Runs the deferred sampling `call` (if any) on the caller's thread."""
    if self.call is not None:
      call, self.call = self.call, None
      out = call()
      if isinstance(out, InFlight):  # scoring still running on the worker (score_later)
        self.job, self.finish = out.job, out.finish
      else:
        self.draw = out

  def resolve(self) -> Any:
    """The finished draw (waits for the job; the finish runs here, on the caller's thread)."""
    self.start()
    if self.draw is None:
      t0 = time.perf_counter()
      value = self.job.result() if isinstance(self.job, concurrent.futures.Future) else self.job
      self.wait_s = time.perf_counter() - t0
      self.draw = value if self.finish is None else self.finish(value)
      self.job = self.finish = None
    return self.draw


class StaleQueue:
  """The draws in flight, oldest first, each tagged with the version that sampled it."""

  def __init__(self, max_staleness: int):
    self.max_staleness = max_staleness
    self._items: collections.deque[InFlight] = collections.deque()
    self.dropped = 0

  def __len__(self) -> int:
    return len(self._items)

  def __iter__(self):
    return iter(self._items)

  @property
  def next_step(self) -> int | None:
    """The step the next submitted draw is for (None when empty)."""
    return self._items[-1].step + 1 if self._items else None

  def put(self, item: InFlight) -> None:
    """Appends `item` (its step must follow the newest one's)."""
    if self._items and item.step != self._items[-1].step + 1:
      raise ValueError(f"draw for step {item.step} submitted after step {self._items[-1].step}")
    self._items.append(item)

  def take(self, step: int, version: int) -> InFlight | None:
    """The draw of `step` for a learner at `version`; None when there is none or when it is
    more than `max_staleness` versions old (then it is dropped, never consumed)."""
    if not self._items:
      return None
    if self._items[0].step != step:
      raise ValueError(f"the oldest draw in flight is for step {self._items[0].step}, not {step}")
    item = self._items.popleft()
    if version - item.version > self.max_staleness:
      self.dropped += 1
      return None
    return item


class DrawQueue:
  """A run's draws in flight (module docstring): submits, bounds, finishes, saves.

  Draws are submitted past the run's last step too (s of them, written with the last
  checkpoint), so a run resumed with a larger `total_steps` consumes what an uninterrupted
  longer run would have.

  The queue owns the params the sampler draws with: `push(train_state)` makes the policy
  of the learner's state the sampler's (`policy_params`).

  Args:
    settings: AsyncSettings.
    sampler_shardings: with split devices, the shardings of the sampler's copy of the
      policy's params (None: the sampler uses the learner's params).
    learner_mesh: with split devices, the learner's mesh (`push_params`).
    policy: the learner's train state -> the policy's params (e.g. the learner's `policy`
      with the run's base params bound); None: `push` is given the params themselves.
  """

  def __init__(self, settings: AsyncSettings, sampler_shardings=None, learner_mesh=None,
               policy: Callable[[Any], Any] | None = None):
    self.settings = settings
    self.in_flight = StaleQueue(settings.max_staleness)
    self._shardings = sampler_shardings
    self._learner_mesh = learner_mesh
    self._policy = (lambda params: params) if policy is None else policy
    # Split devices over several processes: every device program is dispatched from the main
    # thread, in the schedule's order (module docstring: "ordered dispatch").
    self.ordered = sampler_shardings is not None and jax.process_count() > 1
    self._sampler_params = None
    self._push_s = 0.0
    self._taken: InFlight | None = None
    self._worker = (concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="mr_rl_draws")
                    if settings.active else None)

  @classmethod
  def for_run(cls, settings: AsyncSettings, model, sampler_mesh, learner_mesh,
              policy: Callable[[Any], Any] | None = None) -> "DrawQueue":
    """A trainer's draw queue; with split devices (`learner_mesh` given, built by
    `split_meshes`) the sampler's copy of the params is sharded on `sampler_mesh`. PPO's
    critic stays with the learner (its values are computed when the batch is made); a LoRA
    policy is pushed merged (`push`). `policy`: as in `DrawQueue`."""
    n = settings.sampler_devices
    have = 0 if learner_mesh is None else sampler_mesh.devices.size
    if n != have:
      raise ValueError(f"config.asynchrony.sampler_devices={n}, but the components were built "
                       f"with {have} sampler devices (build them with these settings)")
    shardings = None
    if n:
      shardings = sharding.param_shardings(model, sampler_mesh, sharding.DEFAULT_RULES)
    return cls(settings, shardings, learner_mesh, policy)

  # ---------------------------------------------------------------- weights
  @property
  def split(self) -> bool:
    return self._shardings is not None

  def push(self, train_state) -> None:
    """Makes the policy of `train_state` the one the sampler draws with (`policy_params`):
    on one device set the learner's params themselves, on split devices a copy on the
    sampler's devices (timed: `time/weight_push`)."""
    params = self._policy(train_state)
    if not self.split:
      self._sampler_params = params
      return
    # A LoRA policy is pushed merged, on the learner's devices (the sampler decodes merged
    # weights in any case: `mr_rl.rollout.rollout`), so the push has the plain params' shape.
    params = jax.block_until_ready(lora_lib.merge(params))  # (not the push's time)
    t0 = time.perf_counter()
    self._sampler_params = jax.block_until_ready(
        push_params(params, self._shardings, self._learner_mesh))
    self._push_s = time.perf_counter() - t0

  def policy_params(self):
    """The params the sampler draws with: those of the latest `push` (its copy on split
    devices)."""
    if self._sampler_params is None:
      raise RuntimeError("DrawQueue.policy_params before any push: push the learner's state "
                         "first")
    return self._sampler_params

  # ------------------------------------------------------------ submit / take
  def score_later(self, scoring: rollout_lib.StreamingScore, ro: rollout_lib.Rollout,
                  finish: Callable):
    """A draw whose wait for its scores (`StreamingScore.wait`, host-local: the calls started
    as rows finished) runs on the worker thread; `finish(r_BGK, metrics, seconds)` makes the
    draw on the main thread from the gathered rewards (`StreamingScore.finish`: the gather and
    the runner's batch rules). Synchronous (the value itself) without a worker."""
    if self._worker is None or (self.split and not self.ordered):  # already on the worker
      t0 = time.perf_counter()
      r_BGK, m = scoring.finish(ro)
      return finish(r_BGK, m, time.perf_counter() - t0)

    def job():
      t0 = time.perf_counter()
      scoring.wait()
      return time.perf_counter() - t0

    def done(seconds):
      r_BGK, m = scoring.finish(ro)
      return finish(r_BGK, m, seconds)

    return InFlight(-1, -1, self._worker.submit(job), done)

  def fill(self, step: int, draw_fn: Callable[[int], Callable[[], Any]]) -> None:
    """Submits the draws of steps up to `step + max_staleness` with the current policy,
    version `step`. `draw_fn(u)` returns the call that draws step u."""
    u = step if self.in_flight.next_step is None else self.in_flight.next_step
    while u <= step + self.settings.max_staleness:
      self.in_flight.put(self._submit(u, step, draw_fn(u)))
      u += 1

  def _submit(self, u: int, version: int, call: Callable[[], Any]) -> InFlight:
    if self.ordered and u > version:  # sampled once this step's update is dispatched
      return InFlight(u, version, call=call)
    if self.split and not self.ordered:  # sampling and scoring off the main thread
      return InFlight(u, version, self._worker.submit(call))
    out = call()  # sampling here; scoring maybe on the worker (score_later)
    if isinstance(out, InFlight):
      return dataclasses.replace(out, step=u, version=version)
    return InFlight(u, version, draw=out)

  def draw_deferred(self) -> None:
    """Starts the draws `fill` deferred (ordered mode; a no-op otherwise), on this thread.

    The trainer calls it right after dispatching a step's update and before the weight push:
    jax dispatches asynchronously, so the learner's devices run the update while this thread
    drives the sampler's devices through the next draws, with the sampler's copy of the
    weights still the version `fill` recorded (the push comes after).
    """
    for item in self.in_flight:
      item.start()

  def take(self, step: int, draw_fn: Callable[[int], Callable[[], Any]]) -> Any:
    """The draw of `step` for the learner at version `step`."""
    item = self.in_flight.take(step, step)
    if item is None:  # dropped as too stale (or nothing in flight): sample with this policy
      item = self._submit(step, step, draw_fn(step))
    draw = item.resolve()
    self._taken = item
    return draw

  def metrics(self) -> dict[str, float]:
    """The async/* metrics of the step whose draw was taken last, with the time of the
    latest weight push (the one after its update); none for a synchronous run."""
    if not self.settings.active or self._taken is None:
      return {}
    return {"async/staleness": float(self._taken.step - self._taken.version),
            "async/in_flight": float(len(self.in_flight)),
            "async/stale_dropped": float(self.in_flight.dropped),
            "time/reward_wait": self._taken.wait_s, "time/weight_push": self._push_s}

  def settle(self) -> None:
    """Finishes every draw in flight (before evaluation and checkpoints: the reward runner
    and the data iterator are then the main thread's alone)."""
    for item in self.in_flight:
      item.resolve()

  # ---------------------------------------------------------------- resume
  @staticmethod
  def _path(workdir: str, step: int) -> str:
    return os.path.join(workdir, "inflight", f"{step}.p{jax.process_index()}.pkl")

  def save(self, workdir: str, step: int, keep: Iterable[int] = ()) -> None:
    """Writes the draws in flight after `step` (finished first) for a resume at `step`, and
    removes the files of steps neither `step` nor in `keep` (the checkpoints kept)."""
    if not self.settings.active:
      return
    self.settle()
    path = self._path(workdir, step)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    items = [(it.step, it.version, it.draw) for it in self.in_flight]
    with open(path + ".tmp", "wb") as f:
      pickle.dump({"step": step, "items": items}, f)
    os.replace(path + ".tmp", path)
    keep = set(keep) | {step}
    for old in glob.glob(os.path.join(workdir, "inflight", "*.pkl")):
      if int(os.path.basename(old).split(".")[0]) not in keep:
        os.remove(old)

  def restore(self, workdir: str, step: int) -> None:
    """Puts back the draws that were in flight when the checkpoint of `step` was written."""
    if not self.settings.active:
      return
    path = self._path(workdir, step)
    if not os.path.exists(path):
      raise FileNotFoundError(f"the checkpoint of step {step} has no draws in flight at {path} "
                              f"(asynchrony.max_staleness={self.settings.max_staleness}); a "
                              "checkpoint written by an asynchronous run always has one")
    with open(path, "rb") as f:
      saved = pickle.load(f)
    for u, version, draw in saved["items"]:
      self.in_flight.put(InFlight(u, version, draw=draw))

  def __enter__(self) -> "DrawQueue":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def close(self) -> None:
    """Stops the worker thread (draws still in flight are abandoned)."""
    if self._worker is not None:
      self._worker.shutdown(wait=True, cancel_futures=True)
      self._worker = None
