"""Data checks: the rows' fingerprint on resume, every prompt's length at start-up, huge prompts
bounded by characters, non-UTF-8 data files named at load time (docs/runs.md, "Data checks and
the fingerprint").

The trainer runs are the demo's tiny arithmetic policy over a MATH-500-schema `.jsonl` file of
arithmetic problems written here (its prompts use the policy's character vocabulary).
"""

import json
import logging
import os
import shutil

import pytest

from mr_rl import data
from mr_rl import metrics as metrics_lib
from mr_rl import settings as settings_lib
from mr_rl import train as train_lib
from mr_rl.testing.runs import arith_config, assert_same_metrics


def _rows(n, first=0, long_at=()):
  """MATH-500-schema rows of arithmetic prompts `Q:a+b=` (row i of `long_at`: a long chain)."""
  out = []
  for i in range(first, first + n):
    a, b = i % 10, (3 * i + 1) % 10
    expr = "+".join([str(a)] * 40) if i in long_at else f"{a}+{b}"
    out.append(dict(problem=f"Q:{expr}=", solution="", answer=str(a + b), subject="arith",
                    level=1, unique_id=f"row{i}"))
  return out


def _write(path, rows):
  with open(path, "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(path)


def _config(base_policy, path, steps):
  c = arith_config(base_policy, steps)
  c.data.name = "math500"
  c.data.path = path
  c.data.options = {}
  c.rewards.channels = "arith_negative,arith_fmt"  # (MATH-500 rows carry no `answer` field)
  return c


def _run(c, wd, logs=None):
  s = settings_lib.from_config(c)
  return train_lib.train(s, wd, comp=train_lib.build(s), log=None if logs is None
                         else logs.append)


def test_resume_checks_the_rows_fingerprint(base_policy, tmp_path):
  path = _write(tmp_path / "rows.jsonl", _rows(40))
  same, changed, straight = (str(tmp_path / n) for n in ("same", "changed", "straight"))
  _run(_config(base_policy, path, 3), same)
  shutil.copytree(same, changed)
  # Unchanged rows: the resumed run equals an uninterrupted one, bit for bit.
  _run(_config(base_policy, path, 6), same)
  _run(_config(base_policy, path, 6), straight)
  assert_same_metrics(metrics_lib.read_jsonl(os.path.join(same, "metrics.jsonl")),
                      metrics_lib.read_jsonl(os.path.join(straight, "metrics.jsonl")))
  # The file's 40 rows became 10 others: refused, naming both fingerprints, counts, the file.
  _write(path, _rows(10, first=100))
  with pytest.raises(data.DataChangedError) as err:
    _run(_config(base_policy, path, 6), changed)
  msg = str(err.value)
  for needle in ("40 rows", "10 rows", repr(path), "allow_data_change=True", "epoch 0, example 12"):
    assert needle in msg, (needle, msg)
  assert msg.count("data set 'math500'") == 2
  assert len(metrics_lib.read_jsonl(os.path.join(changed, "metrics.jsonl"))) == 3  # untouched
  # With the flag: a warning, and the run goes on (its position is past the 8 usable rows of an
  # epoch now, so at the start of the next epoch).
  c = _config(base_policy, path, 6)
  c.resume.allow_data_change = True
  logs = []
  res = _run(c, changed, logs)
  assert [h["step"] for h in res.history] == [3, 4, 5]
  assert any("allow_data_change: the training rows changed" in line for line in logs), logs
  assert any("continuing at the start of epoch 1" in line for line in logs), logs
  # Its checkpoint records the new rows: a resume without the flag is accepted again.
  res = _run(_config(base_policy, path, 7), changed)
  assert [h["step"] for h in res.history] == [6]


def test_a_checkpoint_without_a_fingerprint_resumes_with_a_log_line(caplog):
  rows = [data.Example.single_turn(f"t/{i}", "t", f"Q:{i}=") for i in range(8)]
  it = data.ResumableIterator(rows, 4, seed=0)
  now = data.fingerprint(rows, "test rows")
  logs = []
  with caplog.at_level(logging.WARNING, logger="mr_rl.data.fingerprint"):
    data.restore_position(it, {"data": {"epoch": 1, "index": 4, "seed": 0}}, now, False, "ckpt",
                          logs.append)
  assert it.state() == {"epoch": 1, "index": 4, "seed": 0}
  assert "records no data fingerprint" in logs[0] and "records no data" in caplog.text
  # The same rows fingerprint the same; any change of text, order or count does not.
  assert data.fingerprint(list(rows), "x")["sha256"] == now["sha256"]
  for other in (rows[::-1], rows[:7], rows[:7] + [data.Example.single_turn("t/7", "t", "Q:8=")]):
    assert data.fingerprint(other, "x")["sha256"] != now["sha256"]


def test_long_prompts_are_found_at_start_up(base_policy, tmp_path):
  """A prompt over data.max_prompt_len (16) stops the build before step 0, naming the file, its
  line, uid and length; skip_long_prompts drops it (not the run at the step that draws it)."""
  path = _write(tmp_path / "rows.jsonl", _rows(12, long_at=(5, 9)))
  c = _config(base_policy, path, 1)
  with pytest.raises(ValueError) as err:
    train_lib.build(settings_lib.from_config(c))
  msg = str(err.value)
  for needle in ("2 of the 12 prompts of the train split 'train' of data set 'math500'",
                 f"line 6 of {path!r}", "uid 'math500/row5'", f"line 10 of {path!r}",
                 "83 tokens", "max_prompt_len=16", "skip_long_prompts=True"):
    assert needle in msg, (needle, msg)
  c.data.skip_long_prompts = True
  comp = train_lib.build(settings_lib.from_config(c))
  assert [ex.uid for ex in comp.train_examples] == [f"math500/row{i}" for i in range(12)
                                                    if i not in (5, 9)]


def test_a_huge_prompt_is_too_long_without_tokenizing_it(base_policy, tmp_path, monkeypatch):
  path = _write(tmp_path / "rows.jsonl", _rows(4))
  comp = train_lib.build(settings_lib.from_config(_config(base_policy, path, 1)))
  policy = comp.policy
  bound = policy.max_prompt_chars
  assert bound >= 16 * 4  # the longest token of the character vocabulary is '<bos>' (5 chars)
  huge = data.Example.single_turn("t/huge", "t", "Q:" + "1+" * bound + "1=")
  tok = policy.tokenizer
  seen = []
  real_call = type(tok).__call__
  monkeypatch.setattr(type(tok), "__call__",  # records the sizes of what is tokenized
                      lambda self, text, **kw: seen.append(len(text)) or real_call(self, text, **kw))
  with pytest.raises(ValueError, match=r"prompt 1 \(uid 't/huge'\): over \d+ characters"):
    data.check_prompt_lengths(policy, [comp.train_examples[0], huge], "test rows", skip=False)
  with pytest.raises(ValueError, match="characters, more than config.data.max_prompt_len=16"):
    policy.encode([huge])
  assert seen == [1]  # one batch call, holding only the short prompt; the huge one never
  assert policy.prompt_lengths([huge]).tolist() == [-1]


def test_non_utf8_bytes_are_named_at_load_time(tmp_path):
  lines = [json.dumps(r).encode() for r in _rows(5)]
  lines[3] = lines[3].replace(b"Q:", b"Q:\xff")
  path = tmp_path / "rows.jsonl"
  path.write_bytes(b"\n".join(lines) + b"\n")
  col = lines[3].index(b"\xff") + 1
  offset = sum(len(x) + 1 for x in lines[:3]) + col - 1
  with pytest.raises(ValueError) as err:
    data.load_dataset("math500", path=str(path))
  msg = str(err.value)
  for needle in (repr(str(path)), "not UTF-8", "line 4,", f"offset {offset} in the file",
                 f"byte {col} of the line", "b'\\xff'"):
    assert needle in msg, (needle, msg)
