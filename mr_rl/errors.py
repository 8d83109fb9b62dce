"""Errors in what the user gave (the config, the workdir, the data): `mr_rl.main` prints them
as one `FATAL <name>: <message>` line, without a traceback (`--verbosity=1` shows it)."""

from __future__ import annotations


class UserError(Exception):
  """Base of the errors whose message says all there is to fix."""


class ConfigError(UserError, ValueError):
  """A config field that is unknown, of the wrong type or out of range
  (`mr_rl.settings.from_config`), or a resume under other settings
  (`mr_rl.checkpointing.check_resume`)."""


class DataError(UserError, ValueError):
  """A data file or prompt the run cannot use: unreadable, empty, not UTF-8, a prompt over
  `data.max_prompt_len` (`mr_rl.data`), each named with its file (and line where known)."""


class DamagedFileError(UserError, ValueError):
  """A file the run reads that does not read back whole (a truncated `settings.json` or
  `model.safetensors`), named with its path and what to do."""
