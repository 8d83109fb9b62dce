"""Reward channels and their registry (docs/methods.md §7).

A channel is a named host-side reward function ``fn(response, example, num_tokens) -> float``
plus how it runs (``kind``). ``REWARDS`` is the project's one registry style
(``mr_rl.registry.Registry``): each entry is a factory ``f(**params) -> RewardChannel``
registered with ``@REWARDS.register`` where it is defined, under the factory's own name.
Channel modules are the registry's plugins, imported on the first lookup:

* ``mr_rl.rewards.math_channels``: accuracy, format, length, brief, negative;
* ``mr_rl.rewards.code_channels``: code_correct, code_fast, code_noop;
* ``mr_rl.rewards.alce``: alce_correctness, alce_citation;
* ``mr_rl.rewards.reward_model``: armorm_helpfulness / _correctness / _coherence,
  reward_model;
* ``mr_rl.rewards.overlong``: overlong (DAPO's soft overlong penalty).

``get_reward(name, **params)`` builds one; ``register_reward(name, factory)`` is the
function form of the decorator.

Your own reward without editing the package: an *import path* ``"my_pkg.rewards:concise"``
in place of a name (``config.rewards.channels = "accuracy,my_pkg.rewards:concise"``).

* The channel is named after the function (``concise``: ``channel_name(spec)``); that name
  is its column, its metric prefix and the key of its parameters
  (``config.rewards.params.concise``: ConfigDict keys cannot hold dots or colons). Two
  import paths whose functions share a name need distinct function names.
* The parameters are bound as keyword arguments, except the reserved ``kind`` ("thread",
  the default, or "process": the worker imports the module by name), ``on_failure``,
  ``batched``, ``value_range`` (``[lo, hi]``) and ``applies`` (see below). A channel gives
  ``value_range`` (failures then score its floor ``lo``) or ``on_failure`` (then its floor:
  the range is ``[on_failure, 1e6]``), or both with ``on_failure <= lo``; neither is a
  ``RewardConfigError`` when it is built, since no default failure value is below every
  function's honest scores (0.0 paid "1e999" more than a near miss of ``-abs(x - 42)``).
* Per-sample ``fn(response, example, num_tokens, **params) -> float | None``, or batched
  ``fn(responses, examples, num_tokens, **params) -> list[float | None]`` over the flattened
  batch (TRL's ``reward_funcs`` convention). Batched is never guessed from the signature:
  mark the function with ``@batched_reward`` or pass the parameter ``batched=True``.
* A module that does not import, a missing or non-callable attribute, or a signature that
  cannot take the three arguments plus the parameters raises ``RewardConfigError``, naming
  the channel, when the channel is built.

Return values (TRL's ``reward_funcs`` convention): a real number in the channel's
``value_range`` (built-in channels declare theirs; a value outside it, +-inf or an int too
large for a float fails that row: ``RewardValueError``, scored ``on_failure``), or ``None`` /
NaN for a response the function cannot score, which scores ``on_failure`` too (TRL reads
None as "does not apply"; here that would let a policy that writes unscorable responses drop
a channel). Whether a channel applies is declared, never inferred from what it returns: ``applies(example) ->
bool`` (``RewardChannel.applies``, ``@applies_when(predicate)`` on the function, or the
reserved parameter ``applies``, an import path or a function, for any channel built by
``get_reward``) sees only the prompt's example; where it is False the channel is not called
and scores NaN ("does not apply"), which the aggregators skip. So no response, and no group
of responses ("I don't know" G times), can take a prompt out of a channel. A *failure* (the
scorer raised, timed out or its worker died on this response) scores the channel's
``on_failure`` value, never above the channel's lowest honest score. A ``RewardConfigError``
says the scorer cannot run here at all (see ``mr_rl.rewards.runner`` for where the line is drawn).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import math
import numbers
import pickle
from typing import Any, Callable, Mapping

import numpy as np

from mr_rl import registry
from mr_rl.registry import Registry

__all__ = ["DEFAULT_VALUE_RANGE", "KINDS", "RESERVED_PARAMS", "REWARDS", "UNIT_RANGE",
           "ExampleFields", "MissingFieldError", "ReadOnlyExampleError", "RewardChannel",
           "RewardConfigError", "applies_when", "available_rewards", "batched_reward",
           "channel_name", "get_reward", "is_import_path", "read_only", "register_reward"]

KINDS = ("thread", "process", "environment")  # environment: mr_rl.multiturn.channels
RESERVED_PARAMS = ("kind", "on_failure", "batched", "value_range", "applies")  # not fn's
DEFAULT_VALUE_RANGE = (-1e6, 1e6)  # the widest range; a channel without one: [on_failure, 1e6]
UNIT_RANGE = (0.0, 1.0)            # of indicator and [0, 1]-scaled built-in channels
_BATCHED_ATTR = "__batched_reward__"
_APPLIES_ATTR = "__reward_applies__"
_IMPORT_PATH_RE = registry.IMPORT_PATH
RewardFn = Callable[[str, Mapping[str, Any], int], float]


class RewardConfigError(ValueError):
  """The scorer cannot run here: an error that is not about the response.

  Raise it from a reward function for bad inputs that no response could fix (a missing or
  malformed example field, an unusable parameter, a reference the verifier cannot read).
  The runner stops the run at the first batch with it, naming the channel and the keys the
  example has. Anything else a reward function raises is a failure on that response.
  """


class MissingFieldError(RewardConfigError, KeyError):
  """A field the channel needs is not in the example (a ``KeyError`` too)."""

  __str__ = BaseException.__str__  # KeyError's would quote the message


class ReadOnlyExampleError(RewardConfigError, TypeError):
  """A channel tried to change the example it was given (a bug in the channel: the example
  is shared with every other channel and response of its prompt)."""


def _refuse(self, *args, **kwargs):
  del args, kwargs
  raise ReadOnlyExampleError(
      f"the example is read-only ({type(self).__name__}): every channel and response of a "
      f"prompt scores against the same one; work on a copy (dict(example), list(...))")


class _ReadOnlyDict(dict):
  """A dict whose mutators raise ``ReadOnlyExampleError`` (still a dict: JSON, isinstance)."""

  __setitem__ = __delitem__ = clear = pop = popitem = setdefault = update = _refuse
  __ior__ = _refuse

  def __reduce__(self):  # pickles (to a process channel's worker) as itself, read-only
    return type(self), (dict(self),)

  def __copy__(self):
    return self

  def __deepcopy__(self, memo):
    return self


class _ReadOnlyList(list):
  """A list whose mutators raise ``ReadOnlyExampleError``."""

  __setitem__ = __delitem__ = __iadd__ = __imul__ = _refuse
  append = clear = extend = insert = pop = remove = reverse = sort = _refuse

  def __reduce__(self):
    return type(self), (list(self),)

  def __copy__(self):
    return self

  def __deepcopy__(self, memo):
    return self


def read_only(value: Any) -> Any:
  """``value`` with every dict, list, set, bytearray and numpy array in it made read-only
  (mappings become read-only dicts, lists read-only lists, sets frozensets, bytearrays bytes,
  arrays read-only copies); tuples are rebuilt around their frozen items; anything else (str,
  numbers, frozen dataclasses such as ``CodeTestSpec``) is returned as it is."""
  if isinstance(value, (str, bytes, int, float, type(None), _ReadOnlyDict, _ReadOnlyList)):
    return value
  if isinstance(value, Mapping):
    cls = type(value) if isinstance(value, ExampleFields) else _ReadOnlyDict
    return cls({k: read_only(v) for k, v in value.items()})
  if isinstance(value, list):
    return _ReadOnlyList(read_only(v) for v in value)
  if isinstance(value, tuple):
    items = [read_only(v) for v in value]
    if all(a is b for a, b in zip(items, value)):
      return value
    return type(value)._make(items) if hasattr(value, "_make") else type(value)(items)
  if isinstance(value, (set, frozenset)):
    return frozenset(read_only(v) for v in value)
  if isinstance(value, bytearray):
    return bytes(value)
  if isinstance(value, np.ndarray):
    out = value.copy()
    out.flags.writeable = False
    return out
  return value


class ExampleFields(_ReadOnlyDict):
  """The example a channel sees in the runner: read-only, shared by every channel and response
  of its prompt (``read_only``: nested containers too; a change raises
  ``ReadOnlyExampleError``, which stops the run naming the channel), and whose missing keys
  raise ``MissingFieldError`` (naming the key and the keys present) instead of a plain
  KeyError, so a channel reading a field the data set does not have stops the run."""

  def __missing__(self, key: Any):
    raise MissingFieldError(f"example has no field {key!r} (keys: {sorted(map(str, self))})")

  @classmethod
  def of(cls, example: Mapping[str, Any]) -> "ExampleFields":
    """A read-only ``ExampleFields`` with ``example``'s fields (nested containers frozen)."""
    return cls({k: read_only(v) for k, v in example.items()})


def _check_importable(name: str, fn: Any) -> None:
  from mr_rl.rewards.process.pool import dumps_importable  # pylint: disable=import-outside-toplevel
  try:
    dumps_importable(fn)
  except pickle.PicklingError as e:
    raise TypeError(f"fn of process channel {name!r} must be importable by name in a worker "
                    f"process (a module-level function or a functools.partial of one; use "
                    f"kind='thread' otherwise): {e}") from e


@dataclasses.dataclass(frozen=True)
class RewardChannel:
  """One named reward channel.

  Attributes:
    name: channel name (a column k of r[B, G, K]).
    fn: ``fn(response, example, num_tokens) -> float | None`` or, when ``batched``,
      ``fn(responses, examples, num_tokens) -> list[float | None]`` over the flattened
      batch (B*G entries, each example repeated G times; TRL's convention).
    kind: "thread" (light rule) or "process" (heavy / untrusted; fn importable by name).
    on_failure: the score of a failed call (raised, timed out, worker died, a value no
      score can be), and of a None / NaN from ``fn``: finite, at most ``value_range``'s
      ``lo`` (default: ``lo``), so no failure outscores an honest answer.
    batched: fn takes the whole batch at once.
    value_range: ``(lo, hi)``, the scores fn can return (inclusive); a score outside it fails
      its row in the runner (``RewardValueError``). Built-in channels declare theirs. A
      channel that declares none must give ``on_failure``, which is then its floor: the range
      is ``(on_failure, DEFAULT_VALUE_RANGE[1])``. Neither: ``ValueError``.
    applies: ``applies(example) -> bool``, the prompts the channel scores (None: every
      prompt). It sees only the (read-only) example, never a response: where it is False the
      channel is not called and its column is NaN ("does not apply"); where it is True every
      response gets a score, and a None / NaN from ``fn`` scores ``on_failure``.
  """
  name: str
  fn: RewardFn
  kind: str = "thread"
  on_failure: float | None = None
  batched: bool = False
  value_range: tuple[float, float] | None = None
  applies: Callable[[Mapping[str, Any]], bool] | None = None

  def __post_init__(self):
    if not isinstance(self.name, str) or not self.name:
      raise ValueError(f"name must be a non-empty str, got {self.name!r}")
    if not callable(self.fn):
      raise TypeError(f"fn of channel {self.name!r} must be callable, got {type(self.fn)}")
    if self.kind not in KINDS:
      raise ValueError(f"kind of channel {self.name!r} must be one of {KINDS}, got {self.kind!r}")
    value = self.on_failure
    if value is None and self.value_range is None:
      raise ValueError(
          f"channel {self.name!r} declares no value_range, so it must give on_failure: the "
          f"score of a failed, timed-out or unscorable row, at most its lowest honest score "
          f"(no default is: 0.0 would pay a crash more than every negative honest score)")
    if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Real)
                              or not math.isfinite(value)):
      raise ValueError(f"on_failure of channel {self.name!r} must be a finite number (a failure "
                       f"is never 'does not apply'), got {value!r}")
    vr = self.value_range
    if vr is None:
      vr = (float(value), DEFAULT_VALUE_RANGE[1])
      if not vr[0] < vr[1]:
        raise ValueError(f"on_failure={value:g} of channel {self.name!r} is its floor and must "
                         f"be below {vr[1]:g} (or declare a value_range)")
    if (not isinstance(vr, (tuple, list)) or len(vr) != 2
        or any(isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v)
               for v in vr) or not vr[0] < vr[1]):
      raise ValueError(f"value_range of channel {self.name!r} must be finite (lo, hi) with "
                       f"lo < hi, got {vr!r}")
    object.__setattr__(self, "value_range", (float(vr[0]), float(vr[1])))
    object.__setattr__(self, "on_failure", float(vr[0] if value is None else value))
    if self.on_failure > vr[0]:
      raise ValueError(f"on_failure={self.on_failure:g} of channel {self.name!r} is above its "
                       f"value_range's floor {vr[0]:g}: a failure would outscore an honest "
                       f"answer scored {vr[0]:g}")
    if self.applies is None and callable(getattr(self.fn, _APPLIES_ATTR, None)):
      object.__setattr__(self, "applies", getattr(self.fn, _APPLIES_ATTR))  # @applies_when
    if self.applies is not None and not callable(self.applies):
      raise TypeError(f"applies of channel {self.name!r} must be None or a function "
                      f"applies(example) -> bool, got {self.applies!r:.80}")
    if not isinstance(self.batched, bool):
      raise TypeError(f"batched of channel {self.name!r} must be a bool, got {self.batched!r}")
    if self.kind == "process":
      _check_importable(self.name, self.fn)


REWARDS: Registry[Callable[..., RewardChannel]] = Registry(
    "reward channel", plugins=("mr_rl.rewards.math_channels", "mr_rl.rewards.code_channels",
                               "mr_rl.rewards.alce", "mr_rl.rewards.reward_model",
                               "mr_rl.rewards.overlong", "mr_rl.multiturn.channels"))


def register_reward(name: str, factory: Callable[..., RewardChannel]) -> None:
  """Registers ``factory(**params) -> RewardChannel`` under ``name`` (``REWARDS.add``)."""
  REWARDS.add(name, factory)


def available_rewards() -> list[str]:
  """Registered channel names, sorted."""
  return list(REWARDS.names())


def batched_reward(fn: Callable) -> Callable:
  """Marks ``fn(responses, examples, num_tokens) -> list[float | None]`` as batched."""
  setattr(fn, _BATCHED_ATTR, True)
  return fn


def applies_when(predicate: Callable[[Mapping[str, Any]], bool]) -> Callable[[Callable], Callable]:
  """Declares the prompts a reward function scores: ``@applies_when(lambda ex: ex["task"] ==
  "math")`` (see ``RewardChannel.applies``; the reserved parameter ``applies`` does the same
  for a channel built by name)."""
  if not callable(predicate):
    raise TypeError(f"applies_when takes a function applies(example) -> bool, got {predicate!r}")

  def mark(fn: Callable) -> Callable:
    setattr(fn, _APPLIES_ATTR, predicate)
    return fn
  return mark


def _resolve(spec: str, what: str) -> Any:
  """The object an import path ``"pkg.mod:attr"`` names (RewardConfigError otherwise)."""
  return registry.resolve_import_path(spec, what, RewardConfigError)


def _applies_param(name: str, value: Any) -> Callable[[Mapping[str, Any]], bool] | None:
  """The reserved parameter ``applies``: None, a function, or an import path naming one."""
  if value is None or callable(value):
    return value
  obj = _resolve(value, f"reward channel {name!r}: parameter applies")
  if not callable(obj):
    raise RewardConfigError(f"reward channel {name!r}: applies={value!r} is a "
                            f"{type(obj).__name__}, not a function")
  return obj


def is_import_path(spec: str) -> bool:
  """True for ``"module:function"`` channel specs (registered names never hold a colon)."""
  return isinstance(spec, str) and ":" in spec


def channel_name(spec: str) -> str:
  """The channel name of a spec: a registered name itself; ``"pkg.mod:fn"`` -> ``"fn"``
  (the last part after the colon), which is also its key in ``config.rewards.params``.

  Raises:
    ValueError: a malformed import path.
  """
  if not is_import_path(spec):
    return spec
  m = _IMPORT_PATH_RE.match(spec)
  if m is None:
    raise ValueError(f"reward channel {spec!r} is not a valid import path: expected "
                     f"'package.module:function'")
  return m["attr"].rsplit(".", 1)[-1]


def _check_signature(name: str, spec: str, fn: Callable, params: Mapping[str, Any],
                     batched: bool) -> None:
  try:
    sig = inspect.signature(fn)
  except (TypeError, ValueError):  # some builtins have no signature: nothing to check
    return
  try:
    sig.bind(None, None, None, **params)
  except TypeError as e:
    args = "responses, examples, num_tokens" if batched else "response, example, num_tokens"
    raise RewardConfigError(
        f"reward channel {name!r} ({spec!r}): {'batched ' if batched else ''}function "
        f"{getattr(fn, '__qualname__', fn)}{sig} must accept ({args}) positionally"
        f"{' and the parameters ' + str(sorted(params)) + ' by keyword' if params else ''}: "
        f"{e}") from e


def _from_import_path(spec: str, params: Mapping[str, Any]) -> RewardChannel:
  name = channel_name(spec)
  module_name, attr = spec.split(":", 1)
  try:
    obj = importlib.import_module(module_name)
  except Exception as e:  # pylint: disable=broad-except  (ImportError or the module's own)
    raise RewardConfigError(f"reward channel {name!r} ({spec!r}): module {module_name!r} did "
                            f"not import: {e!r}") from e
  for part in attr.split("."):
    if not hasattr(obj, part):
      raise RewardConfigError(f"reward channel {name!r} ({spec!r}): module {module_name!r} has "
                              f"no attribute {attr!r}")
    obj = getattr(obj, part)
  if not callable(obj):
    raise RewardConfigError(f"reward channel {name!r} ({spec!r}): {attr!r} is a "
                            f"{type(obj).__name__}, not a function")
  params = dict(params)
  kind = params.pop("kind", "thread")
  on_failure = params.pop("on_failure", None)
  batched = params.pop("batched", bool(getattr(obj, _BATCHED_ATTR, False)))
  value_range = params.pop("value_range", None)
  applies = _applies_param(name, params.pop("applies", getattr(obj, _APPLIES_ATTR, None)))
  _check_signature(name, spec, obj, params, bool(batched))
  fn = functools.partial(obj, **params) if params else obj
  try:
    return RewardChannel(name, fn, kind, on_failure=on_failure, batched=batched,
                         value_range=tuple(value_range) if isinstance(value_range, list)
                         else value_range, applies=applies)
  except (TypeError, ValueError) as e:
    raise RewardConfigError(f"reward channel {name!r} ({spec!r}): {e}") from e


def get_reward(name: str, **params: Any) -> RewardChannel:
  """Builds the registered channel ``name`` (or the import path ``"module:function"``, see
  the module docstring) with ``params``.

  Raises:
    mr_rl.registry.UnknownNameError (a ValueError): unknown name (the message lists the
      valid ones).
    RewardConfigError: an import path that does not import, or whose function has the wrong
      signature.
    ValueError / TypeError: bad parameters of a registered channel (on Python >= 3.11 with a
      note naming the channel).
  """
  if is_import_path(name):
    return _from_import_path(name, params)
  factory = REWARDS.get(name)
  params = dict(params)
  applies = params.pop("applies", None)
  try:
    channel = factory(**params)
  except Exception as e:
    if hasattr(e, "add_note"):
      e.add_note(f"while building reward channel {name!r} with parameters {params}")
    raise
  if applies is not None:
    channel = dataclasses.replace(channel, applies=_applies_param(channel.name, applies))
  return channel
