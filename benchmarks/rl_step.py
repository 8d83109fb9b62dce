r"""One whole GRPO step (rollout + rewards + update): mr_rl's trainer vs TRL's GRPOTrainer.

Same HF checkpoint, same settings, one process: 8 prompts x G 8, <= 48 new tokens, temperature 1,
AdamW lr 2e-4 (constant, no weight decay, clip-norm 1.0), clip 0.2 / 0.28, token-mean loss
(TRL `loss_type="dapo"`), no KL and no reference model, one optimizer step per batch (TRL
`num_iterations=1`, `steps_per_generation=1`: no old-log-prob pass), `GRPOConfig(use_cpu=True,
report_to="none")`. TRL is fed, unshuffled, the very prompt batches mr_rl's iterator draws.
Sizes: `demo` (mr_rl/demo/assets/base_policy, 0.50M params) and `20m`, a random Qwen3 layout
(d 512, 6 layers, 8 / 4 heads of 64, d_ff 1664; 20.1M) written here by transformers with the
demo tokenizer: it stops at EOS on its own (mean ~17 tokens, 6-8% cut at 48 before training),
so lengths are ragged for both.

Each trainer runs in its own thread and a baton gives one step at a time to each in turn
(rotating order): steps never overlap and load drift hits all sides alike. A step's time is the
time its trainer held the baton: mr_rl's step ends at its console line "step t/T" (its log also
carries a line per compile), TRL's at `on_step_end`. A side that ends a step more or fewer than
it was given stops the run with an error, and each trainer's thread must end by itself after its
last step (tests/benchmarks/test_rl_step.py). Both sides compute the same rewards (`REWARDS`):
at `demo` 1 when the response ends with the answer's digits (TRL decodes with special tokens
skipped, so mr_rl's channel strips them first: equal texts, tests/benchmarks/test_rl_step.py);
at `20m` -|L - 16| on the token count L, which holds a random model's lengths near its untrained
mean (a text reward lets lr 2e-4 move them within a few steps, each side its own way).

Reported (medians of the timed steps): s/step, steps/s, real response tokens/s (unpadded, EOS
included), rollout / reward / rest (advantages, batch, policy step, metrics), mr_rl / TRL, and
the achieved FLOP/s on real tokens (`step_flops`: per row the sampler's forward and the update's
forward + backward over prompt + response, causal attention) against a 2048^2 fp32 matmul of
the same run (benchmarks/roofline.py, best measurement). Cost growth (demo size; 20m with
`--doubled-20m`): both again with `max_new_tokens` doubled on a copy of the checkpoint with
`max_position_embeddings` raised (RoPE: outputs unchanged below the old limit); mr_rl's sampler
draws token t with fold_in(key, t), so its responses are the same except where the shorter cap
cut them (JSON `response_len_by_step` has every step's mean length).

  pip install -e .[bench]        # TRL 1.16.0 + accelerate 1.15.0 beside the CPU torch 2.13.0
  python benchmarks/rl_step.py --quick --json /tmp/rl_step.json  # demo 1+4, 20m 1+2 steps
  python benchmarks/rl_step.py --json /tmp/rl_step.json          # demo 2+12, 20m 2+4 steps
  python benchmarks/rl_step.py --quick --pack --sizes 20m        # + mr_rl with packed rows

The load average is stored with every size; figures measured under load are indicative.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Callable, Sequence

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # roofline.py, report.py
import report  # noqa: E402

DEMO_POLICY = os.path.join(_ROOT, "mr_rl", "demo", "assets", "base_policy")
SHAPE_20M = dict(hidden_size=512, num_hidden_layers=6, num_attention_heads=8,
                 num_key_value_heads=4, head_dim=64, intermediate_size=1664)
# Reward of each size (both sides compute it identically): the trained demo policy's lengths are
# stable, so it gets a text reward; a random model's lengths run off within a few lr-2e-4 steps
# (each side its own way), so at 20m a token-count reward holds them near the untrained mean.
REWARDS = {"demo": ("answer_suffix", {}), "20m": ("length_target", {"target": 16})}
BATCH_PROMPTS, GROUP, MAX_PROMPT_LEN, MAX_NEW, LR = 8, 8, 16, 48, 2e-4
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_BATON_TIMEOUT_S = 3600.0


# ---------------------------------------------------------------------------- checkpoints
def write_random_qwen3(out_dir: str, tokenizer_dir: str = DEMO_POLICY, *, seed: int = 0,
                       max_position_embeddings: int = 64, **shape: int) -> str:
  """Writes a random-weight Qwen3 checkpoint (transformers' own init) with `tokenizer_dir`'s
  tokenizer; `shape` holds Qwen3Config sizes (default SHAPE_20M). Returns `out_dir`."""
  import torch
  from transformers import AutoTokenizer, Qwen3Config, Qwen3ForCausalLM
  tok = AutoTokenizer.from_pretrained(tokenizer_dir)
  cfg = Qwen3Config(vocab_size=len(tok), max_position_embeddings=max_position_embeddings,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                    eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                    **(shape or SHAPE_20M))
  torch.manual_seed(seed)
  Qwen3ForCausalLM(cfg).to(torch.float32).save_pretrained(out_dir)
  for name in _TOKENIZER_FILES:
    if os.path.isfile(os.path.join(tokenizer_dir, name)):
      shutil.copy(os.path.join(tokenizer_dir, name), out_dir)
  return out_dir


def raise_position_limit(src: str, dst: str, max_position_embeddings: int) -> str:
  """A copy of checkpoint `src` at `dst` whose config.json allows `max_position_embeddings`
  (weights untouched; with RoPE the outputs below the old limit are unchanged)."""
  with open(os.path.join(src, "config.json")) as f:
    cfg = json.load(f)
  if cfg["max_position_embeddings"] > max_position_embeddings:
    raise ValueError(f"{src} already allows {cfg['max_position_embeddings']} positions "
                     f"> {max_position_embeddings}")
  shutil.copytree(src, dst)
  cfg["max_position_embeddings"] = max_position_embeddings
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump(cfg, f, indent=2)
  return dst


def read_shape(path: str) -> dict:
  """The sizes the FLOP count needs, from a checkpoint's config.json."""
  with open(os.path.join(path, "config.json")) as f:
    hf = json.load(f)
  heads = hf["num_attention_heads"]
  return dict(d=hf["hidden_size"], layers=hf["num_hidden_layers"], heads=heads,
              kv_heads=hf.get("num_key_value_heads") or heads,
              head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
              d_ff=hf["intermediate_size"], vocab=hf["vocab_size"],
              max_positions=hf["max_position_embeddings"])


# ----------------------------------------------------------------------------- FLOP count
def body_matmul_params(s: dict) -> int:
  """Weights of the matmuls of the transformer body (q, k, v, o and the SwiGLU MLP)."""
  attn = s["d"] * s["head_dim"] * (2 * s["heads"] + 2 * s["kv_heads"])
  return s["layers"] * (attn + 3 * s["d"] * s["d_ff"])


def forward_flops(s: dict, n_in: int, n_logits: int, causal: bool = True) -> float:
  """Matmul FLOPs of one forward pass over `n_in` positions with the LM head on `n_logits`.

  2 FLOPs per multiply-add: 2 * body weights per position, 2 * d * V per logit, and per layer
  and query head QK^T plus AV, 4 * head_dim per (query, key) pair: n(n+1)/2 pairs when
  causal, n^2 with the full square (what an unmasked kernel computes).
  """
  pairs = n_in * (n_in + 1) / 2 if causal else n_in * n_in
  attention = 4 * s["layers"] * s["heads"] * s["head_dim"] * pairs
  return 2 * body_matmul_params(s) * n_in + 2 * s["d"] * s["vocab"] * n_logits + attention


def step_flops(s: dict, prompt_lens: Sequence[int], response_lens: Sequence[int]) -> float:
  """FLOPs a GRPO step needs on real tokens: per row (prompt p, response r, EOS included) the
  sampler's forward and the update's forward + backward (3x) over the p + r - 1 positions that
  are fed in, with logits on the r positions that predict the response."""
  if len(prompt_lens) != len(response_lens):
    raise ValueError(f"{len(prompt_lens)} prompt lengths for {len(response_lens)} responses")
  return float(sum(4 * forward_flops(s, p + r - 1, r) for p, r in zip(prompt_lens, response_lens)))


# ---------------------------------------------------------------------------------- reward
def special_tokens() -> tuple[str, ...]:
  """The demo tokenizer's special tokens (both benchmark checkpoints carry that tokenizer)."""
  from mr_rl.demo import task
  return task.SPECIAL + task.TAGS


def strip_special(text: str, specials: Sequence[str]) -> str:
  """`text` without the special-token strings: mr_rl's decoded response (special tokens kept)
  turned into what TRL's `batch_decode(..., skip_special_tokens=True)` gives."""
  return re.sub("|".join(re.escape(t) for t in sorted(specials, key=len, reverse=True)), "",
                text)


def answer_suffix(text: str, answer: int) -> float:
  """1 if the tag-free response ends with the answer's digits (a learnable, ragged signal)."""
  return float(text.endswith(str(int(answer))))


def length_target(num_tokens: int, target: int) -> float:
  """-|L - target| for a response of L tokens (EOS included): holds lengths near `target`."""
  return -float(abs(int(num_tokens) - int(target)))


def _register_channels() -> None:
  """mr_rl's side of the rewards: channels `bench_answer_suffix`, `bench_length_target`."""
  from mr_rl.rewards import runner as rewards
  if "bench_answer_suffix" in rewards.available_rewards():
    return
  specials = special_tokens()
  rewards.register_reward("bench_answer_suffix", lambda: rewards.RewardChannel(
      "bench_answer_suffix",
      lambda resp, ex, n: answer_suffix(strip_special(resp, specials), ex["answer"]),
      value_range=(0.0, 1.0)))
  rewards.register_reward("bench_length_target", lambda target: rewards.RewardChannel(
      "bench_length_target", lambda resp, ex, n: length_target(n, target),
      value_range=(-1e6, 0.0)))  # -|L - target|: a failure (none expected) scores the floor


# ---------------------------------------------------------------------------------- baton
class Baton:
  """One trainer thread's turn: the main thread hands it the baton for one step at a time.

  In the trainer's thread: `wait()` before the first step and `step_done()` at the end of each
  (it records the step's time, hands the baton back and waits for the next turn). After the
  last turn the main thread calls `finish()`: the trainer then runs to its end alone, and a
  `step_done` after that (a step more than the run was given) raises instead of waiting for a
  turn that will never come.
  """

  def __init__(self, name: str):
    self.name, self.step_s, self.error = name, [], None
    self._go, self._done, self._t0 = threading.Event(), threading.Event(), None
    self._finished = False

  def wait(self) -> None:
    if not self._go.wait(_BATON_TIMEOUT_S):
      raise TimeoutError(f"{self.name}: no turn within {_BATON_TIMEOUT_S} s")
    self._go.clear()
    if self._finished:
      return
    self._t0 = time.perf_counter()

  def step_done(self) -> None:
    if self._finished:
      raise RuntimeError(f"{self.name}: a step ended after the last turn "
                         f"({len(self.step_s)} steps timed)")
    self.step_s.append(time.perf_counter() - self._t0)
    self._done.set()
    self.wait()

  def turn(self) -> None:
    """Main thread: lets the trainer run until its next `step_done` (or its end)."""
    steps = len(self.step_s)
    self._done.clear()
    self._go.set()
    if not self._done.wait(_BATON_TIMEOUT_S):
      raise TimeoutError(f"{self.name}: step did not finish within {_BATON_TIMEOUT_S} s")
    if self.error is not None:
      raise RuntimeError(f"{self.name} failed") from self.error
    if len(self.step_s) == steps:
      raise RuntimeError(f"{self.name} ended after {steps} steps")

  def finish(self) -> None:
    """Main thread, after the last turn: the trainer runs to its end without the baton."""
    self._finished = True
    self._go.set()


def run_alternating(sides: list, steps: int) -> None:
  """Runs every side's `run(baton)` in its own thread, one step at a time in rotating order;
  then lets each finish alone and checks it ended by itself after exactly `steps` steps."""
  threads = []
  for side in sides:
    def target(side=side):
      try:
        side.baton.wait()
        side.run(side.baton)
      except BaseException as e:  # reported by Baton.turn in the main thread
        side.baton.error = e
      finally:
        side.baton._done.set()
    threads.append(threading.Thread(target=target, name=side.name, daemon=True))
    threads[-1].start()
  try:
    for i in range(steps):
      for side in sides[i % len(sides):] + sides[:i % len(sides)]:
        side.baton.turn()
        print(f"  step {i}: {side.name:<10s} {side.baton.step_s[-1]:7.3f} s", flush=True)
  finally:  # (a failed side: the others still run to their end, so no thread is left waiting)
    for side, thread in zip(sides, threads):  # let each finish alone
      side.baton.finish()
      thread.join(_BATON_TIMEOUT_S)
  for side, thread in zip(sides, threads):
    if thread.is_alive():
      raise TimeoutError(f"{side.name}: still running {_BATON_TIMEOUT_S} s after its last step")
    if side.baton.error is not None:
      raise RuntimeError(f"{side.name} failed after its last step") from side.baton.error
    if len(side.baton.step_s) != steps:
      raise RuntimeError(f"{side.name}: {len(side.baton.step_s)} steps timed, not {steps}")


# ---------------------------------------------------------------------------------- mr_rl
class _RecordingRunner:
  """mr_rl's reward runner, recording each step's response lengths and prompt uids (the
  trainer scores rows as they finish: `RewardRunner.start`, then `PendingScores.add` per row)."""

  def __init__(self, runner):
    self._runner, self.lengths, self.uids = runner, [], []

  def start(self, examples_B, group_size):
    self.uids.append([ex["uid"] for ex in examples_B])
    lengths = [0] * (len(examples_B) * group_size)  # row b * G + g, filled as rows are added
    self.lengths.append(lengths)
    pending = self._runner.start(examples_B, group_size)
    add = pending.add

    def recording_add(b, g, response, num_tokens):
      lengths[b * group_size + g] = int(num_tokens)
      add(b, g, response, num_tokens)

    pending.add = recording_add
    return pending

  def __getattr__(self, name):
    return getattr(self._runner, name)


class MrRlSide:
  """mr_rl's trainer (`mr_rl.train.train`) on checkpoint `path` for `steps` GRPO steps."""

  def __init__(self, name: str, path: str, max_new_tokens: int, steps: int, reward: tuple,
               seed: int = 0, pack: bool = False):
    import dataclasses
    from mr_rl import data, settings as settings_lib, train as train_lib
    _register_channels()
    c = settings_lib.default_config()
    c.plugins, c.seed, c.total_steps, c.log_every = "mr_rl.demo", seed, steps, 1
    c.checkpoint_every, c.kl_ref_every = 0, 0  # no KL term, so no reference forward
    c.model.path = path
    c.data.name, c.data.batch_prompts, c.data.max_prompt_len = "arithmetic", BATCH_PROMPTS, \
        MAX_PROMPT_LEN
    c.data.options = dict(num_train=max(64, steps * BATCH_PROMPTS), num_eval=16, seed=seed)
    c.rollout.group_size, c.rollout.max_new_tokens = GROUP, max_new_tokens
    c.optim.lr, c.optim.weight_decay, c.optim.warmup_steps = LR, 0.0, 0
    c.optim.max_grad_norm, c.optim.num_micro_batches = 1.0, 1
    loss = c.optim.loss
    loss.eps_low, loss.eps_high, loss.loss_agg, loss.kl_coef = 0.2, 0.28, "token-mean", 0.
    c.rewards.channels = f"bench_{reward[0]}"
    c.rewards.params = {f"bench_{reward[0]}": dict(reward[1])} if reward[1] else {}
    c.aggregator.name, c.advantage.name = "additive", "grpo"
    c.optim.pack = pack  # packed update rows (docs/architecture.md "The learner batch")
    self.name, self.max_new_tokens, self.baton = name, max_new_tokens, Baton(name)
    self.settings = settings_lib.from_config(c)
    comp = train_lib.build(self.settings)
    self.runner = _RecordingRunner(comp.runner)
    self.comp = dataclasses.replace(comp, runner=self.runner)
    self.prompt_len = {ex.uid: len(comp.policy.prompt_ids(ex)) for ex in comp.train_examples}
    it = data.ResumableIterator(list(comp.train_examples), BATCH_PROMPTS, seed=seed)
    self.batches = [next(it) for _ in range(steps)]  # what train.train will draw, in order
    self._train, self.history, self.lines = train_lib.train, None, []

  def run(self, baton: Baton) -> None:
    """`train.train`, its step boundaries read off its log: with log_every 1 the console line
    of step t (`metrics.console_line`: "step t/T | ...") is written once, when step t is done.
    The other lines (each compile, `mr_rl.compilation`) happen inside a step and are kept in
    `self.lines`; taking every line for a step's end timed those steps 0 s and left the
    trainer waiting, after the run's last turn, for a turn that never came."""
    total = self.settings.total_steps

    def log(line: str) -> None:
      self.lines.append(line)
      if line.startswith("step "):
        expected = f"step {len(baton.step_s) + 1}/{total} |"
        if not line.startswith(expected):
          raise RuntimeError(f"{self.name}: expected a line starting {expected!r}, got {line!r}")
        baton.step_done()

    res = self._train(self.settings, None, comp=self.comp, log=log)
    self.history = res.history

  def records(self) -> list[dict]:
    if self.history is None or len(self.history) != len(self.baton.step_s):
      raise RuntimeError(f"{self.name}: {len(self.baton.step_s)} timed steps, history "
                         f"{None if self.history is None else len(self.history)}")
    out = []
    for h, step_s, lens, uids in zip(self.history, self.baton.step_s, self.runner.lengths,
                                     self.runner.uids):
      out.append(dict(step_s=step_s, rollout_s=h["time/rollout"], reward_s=h["time/reward"],
                      own_update_s=h["time/update"], response_lens=lens,
                      prompt_lens=[self.prompt_len[u] for u in uids for _ in range(GROUP)],
                      truncated_frac=h["response/truncated_frac"]))
    return out


# ------------------------------------------------------------------------------------ TRL
def trl_reward(name: str, params: dict) -> Callable:
  """TRL's side of reward `name` (completions come decoded without special tokens, and
  completion_ids hold the response tokens, EOS included, as mr_rl's lengths count them)."""
  if name == "answer_suffix":
    def fn(prompts, completions, answer, **_):
      return [answer_suffix(text, a) for text, a in zip(completions, answer)]
  elif name == "length_target":
    def fn(prompts, completions, completion_ids, **_):
      return [length_target(len(ids), params["target"]) for ids in completion_ids]
  else:
    raise ValueError(f"unknown benchmark reward {name!r}; valid: answer_suffix, length_target")
  fn.__name__ = f"bench_{name}"
  return fn


class TrlSide:
  """TRL's GRPOTrainer on checkpoint `path`, fed the prompt batches of `batches` in order."""

  def __init__(self, name: str, path: str, max_new_tokens: int, batches: list, policy,
               workdir: str, reward: tuple, seed: int = 0):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, \
        TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    self.name, self.max_new_tokens, self.baton, self.rec = name, max_new_tokens, Baton(name), []
    tok = AutoTokenizer.from_pretrained(path)
    examples = [ex for batch in batches for ex in batch]
    prompts = [tok.bos_token + ex.prompt for ex in examples]
    for ex, text in zip(examples, prompts):  # the very prompt tokens mr_rl feeds its sampler
      if tok(text)["input_ids"] != policy.prompt_ids(ex):
        raise ValueError(f"TRL would tokenize {ex.uid} as {tok(text)['input_ids']}, mr_rl as "
                         f"{policy.prompt_ids(ex)}")
    dataset = datasets.Dataset.from_dict(
        {"prompt": prompts, "answer": [int(ex.metadata["answer"]) for ex in examples]})
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, report_to="none", seed=seed, max_steps=len(batches),
        per_device_train_batch_size=BATCH_PROMPTS * GROUP, num_generations=GROUP,
        gradient_accumulation_steps=1, num_iterations=1, max_completion_length=max_new_tokens,
        temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, epsilon=0.2, epsilon_high=0.28,
        loss_type="dapo", beta=0.0, scale_rewards="group", shuffle_dataset=False,
        save_strategy="no", disable_tqdm=True, log_completions=False, bf16=False, fp16=False,
        dataloader_num_workers=0)
    rec, eos = self.rec, tok.eos_token_id
    baton = self.baton

    class Timed(GRPOTrainer):
      def _generate(self, prompts):
        t0 = time.perf_counter()
        out = super()._generate(prompts)
        rec.append(dict(rollout_s=time.perf_counter() - t0,
                        prompt_lens=[len(p) for p in out[0]],
                        response_lens=[len(c) for c in out[1]],
                        truncated_frac=float(np.mean([c[-1] != eos for c in out[1]]))))
        return out

      def _calculate_rewards(self, *a, **kw):
        t0 = time.perf_counter()
        out = super()._calculate_rewards(*a, **kw)
        rec[-1]["reward_s"] = time.perf_counter() - t0
        return out

    class StepEnd(TrainerCallback):
      def on_step_end(self, args, state, control, **kw):
        baton.step_done()

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    self.trainer = Timed(model=model, reward_funcs=[trl_reward(*reward)], args=args,
                         train_dataset=dataset, processing_class=tok, callbacks=[StepEnd()])
    self.trainer.remove_callback(PrinterCallback)

  def run(self, baton: Baton) -> None:
    self.trainer.train()

  def records(self) -> list[dict]:
    if len(self.rec) != len(self.baton.step_s):
      raise RuntimeError(f"{self.name}: {len(self.baton.step_s)} steps, {len(self.rec)} rollouts")
    return [dict(r, step_s=s) for r, s in zip(self.rec, self.baton.step_s)]


# ---------------------------------------------------------------------------- summaries
def summarize(side, shape: dict, warmup: int) -> dict:
  """Medians over the timed steps of one trainer (first `warmup` steps dropped)."""
  every = side.records()
  recs = every[warmup:]
  if not recs:
    raise ValueError(f"{side.name}: no timed steps after {warmup} warm-up steps")
  med = lambda key: statistics.median(r[key] for r in recs)
  for r in recs:
    r["response_tokens"] = int(sum(r["response_lens"]))
    r["flops"] = step_flops(shape, r["prompt_lens"], r["response_lens"])
    r["rest_s"] = r["step_s"] - r["rollout_s"] - r["reward_s"]
    r["tokens_per_s"] = r["response_tokens"] / r["step_s"]
    r["flops_per_s"] = r["flops"] / r["step_s"]
  out = dict(max_new_tokens=side.max_new_tokens, steps_timed=len(recs), step_s=med("step_s"),
             step_s_all=[r["step_s"] for r in recs], rollout_s=med("rollout_s"),
             reward_s=med("reward_s"), rest_s=med("rest_s"),
             tokens_per_s=med("tokens_per_s"), gflops_per_s=med("flops_per_s") / 1e9,
             response_len_mean=float(np.mean([np.mean(r["response_lens"]) for r in recs])),
             response_tokens_per_step=med("response_tokens"),
             truncated_frac=float(np.mean([r["truncated_frac"] for r in recs])),
             # every step, warm-up included: training moves the length distribution
             response_len_by_step=[float(np.mean(r["response_lens"])) for r in every])
  out["steps_per_s"] = 1.0 / out["step_s"]
  if "own_update_s" in recs[0]:
    out["own_update_s"] = med("own_update_s")  # mr_rl's time/update
  return out


def param_count(path: str) -> int:
  from mr_rl import models
  with open(os.path.join(path, "config.json")) as f:
    return models.count_params(models.config_from_hf(json.load(f)))


def run_size(label: str, path: str, raised: str, steps: int, warmup: int, doubled: bool,
             tmp: str, pack: bool = False) -> dict:
  """Alternates mr_rl and TRL (and, with `doubled`, both again at twice the cap on the copy
  `raised` of the checkpoint; with `pack`, mr_rl with packed update rows as a third side)
  step by step on checkpoint `path`."""
  shape = read_shape(path)
  print(f"\n== {label}: {path} ({param_count(path) / 1e6:.2f}M params)", flush=True)
  reward = REWARDS[label]
  mr = MrRlSide("mr_rl", path, MAX_NEW, steps, reward)
  sides = [mr, TrlSide("trl", path, MAX_NEW, mr.batches, mr.comp.policy,
                       os.path.join(tmp, f"trl_{label}"), reward)]
  if pack:  # same seed, so the same rollouts as "mr_rl" (up to float rounding of the update)
    sides.append(MrRlSide("mr_rl+pack", path, MAX_NEW, steps, reward, pack=True))
  if doubled:
    mr2 = MrRlSide(f"mr_rl@{2 * MAX_NEW}", raised, 2 * MAX_NEW, steps, reward)
    sides += [mr2, TrlSide(f"trl@{2 * MAX_NEW}", raised, 2 * MAX_NEW, mr2.batches,
                           mr2.comp.policy, os.path.join(tmp, f"trl2_{label}"), reward)]
  load_start = report.load_avg()
  t0 = time.perf_counter()
  run_alternating(sides, steps)
  res = dict(checkpoint=path, params=param_count(path), shape=shape, reward=reward,
             load_avg_start=load_start,
             load_avg_end=report.load_avg(), seconds=time.perf_counter() - t0,
             sides={s.name: summarize(s, shape, warmup) for s in sides})
  r = res["sides"]
  res["ratio_tokens_per_s"] = r["mr_rl"]["tokens_per_s"] / r["trl"]["tokens_per_s"]
  res["ratio_step"] = r["trl"]["step_s"] / r["mr_rl"]["step_s"]
  if pack:
    res["ratio_tokens_per_s_pack"] = r["mr_rl+pack"]["tokens_per_s"] / r["trl"]["tokens_per_s"]
  if doubled:
    res["growth_mr_rl"] = r[f"mr_rl@{2 * MAX_NEW}"]["step_s"] / r["mr_rl"]["step_s"] - 1
    res["growth_trl"] = r[f"trl@{2 * MAX_NEW}"]["step_s"] / r["trl"]["step_s"] - 1
  return res


# ------------------------------------------------------------------------------------ main
GOALS = dict(ratio_demo=2.0, ratio_20m=1.5, flops_fraction=0.60, growth=0.15)


def _table(res: dict, peak: float) -> str:
  lines = [f"{'trainer':<10s} {'cap':>4s} {'s/step':>7s} {'steps/s':>7s} {'resp tok/s':>10s} "
           f"{'len':>5s} {'trunc':>5s} {'rollout':>7s} {'reward':>6s} {'rest':>6s} "
           f"{'GFLOP/s':>7s} {'of mm':>6s}"]
  for name, r in res["sides"].items():
    lines.append(f"{name:<10s} {r['max_new_tokens']:4d} {r['step_s']:7.3f} "
                 f"{r['steps_per_s']:7.2f} {r['tokens_per_s']:10.0f} "
                 f"{r['response_len_mean']:5.1f} {100 * r['truncated_frac']:4.0f}% "
                 f"{r['rollout_s']:7.3f} {r['reward_s']:6.3f} {r['rest_s']:6.3f} "
                 f"{r['gflops_per_s']:7.1f} {100 * r['gflops_per_s'] * 1e9 / peak:5.1f}%")
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--quick", action="store_true",
                 help="demo 1+4 steps, 20m 1+2 steps")
  p.add_argument("--sizes", default="demo,20m", help="comma-separated: demo, 20m")
  p.add_argument("--steps", type=int, default=12, help="timed steps per trainer at the demo size")
  p.add_argument("--steps-20m", type=int, default=4, help="timed steps per trainer at 20m")
  p.add_argument("--warmup", type=int, default=2, help="steps dropped (compiles, first calls)")
  p.add_argument("--doubled-20m", action="store_true",
                 help="also run the doubled-cap pair at 20m (the demo size always runs it; at "
                      "20m training moves the lengths, so the two caps see different ones)")
  p.add_argument("--pack", action="store_true",
                 help="also run mr_rl with packed update rows (config.optim.pack)")
  p.add_argument("--json", default=None, help="write the results here")
  a = p.parse_args(argv)
  sizes = [x.strip() for x in a.sizes.split(",") if x.strip()]
  if not sizes or set(sizes) - {"demo", "20m"}:
    raise ValueError(f"--sizes must name demo and/or 20m, got {a.sizes!r}")
  if a.quick:
    a.steps, a.steps_20m, a.warmup, a.doubled_20m = 4, 2, 1, False
  for name in ("steps", "steps_20m"):
    if getattr(a, name) < 1:
      raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")
  if a.warmup < 0:
    raise ValueError(f"--warmup must be >= 0, got {a.warmup}")
  try:
    import trl
  except ImportError as e:
    raise SystemExit("benchmarks/rl_step.py needs TRL: pip install -e .[bench]") from e
  import warnings
  import jax
  import torch
  import transformers
  from roofline import matmul_flops_per_s
  transformers.logging.set_verbosity_error()  # TRL / transformers deprecation chatter
  warnings.filterwarnings("ignore", category=FutureWarning)
  res = dict(backend=jax.default_backend(), cpu_count=os.cpu_count(),
             torch_threads=torch.get_num_threads(), versions=dict(
                 trl=trl.__version__, torch=torch.__version__, jax=jax.__version__,
                 transformers=transformers.__version__),
             quick=a.quick, load_avg_start=report.load_avg(), goals=GOALS)
  print(f"backend {res['backend']} ({res['cpu_count']} CPUs, torch {res['torch_threads']} "
        f"threads), load average {res['load_avg_start']}", flush=True)
  t_start = time.perf_counter()
  mm = [matmul_flops_per_s(reps=8)]
  print(f"large fp32 matmul: {mm[-1] / 1e9:.1f} GFLOP/s", flush=True)
  res["sizes"] = {}
  with tempfile.TemporaryDirectory() as tmp:
    for label in sizes:
      if label == "demo":
        path, steps, doubled = DEMO_POLICY, a.steps, True
      else:
        path = write_random_qwen3(os.path.join(tmp, "qwen3_20m"))
        steps, doubled = a.steps_20m, a.doubled_20m
      limit = read_shape(path)["max_positions"]
      raised = raise_position_limit(path, os.path.join(tmp, f"{label}_raised"),
                                    max(limit, MAX_PROMPT_LEN + 2 * MAX_NEW))
      res["sizes"][label] = run_size(label, path, raised, a.warmup + steps, a.warmup, doubled, tmp,
                                     pack=a.pack)
      mm.append(matmul_flops_per_s(reps=8))
      print(f"large fp32 matmul: {mm[-1] / 1e9:.1f} GFLOP/s", flush=True)
  peak = max(mm)
  res.update(matmul_gflops=[x / 1e9 for x in mm], load_avg_end=report.load_avg(),
             seconds=time.perf_counter() - t_start)
  verdicts = {}  # goal name -> (measured, goal, met)
  for label, r in res["sizes"].items():
    for side in r["sides"].values():
      side["flops_fraction"] = side["gflops_per_s"] * 1e9 / peak
    got = dict(ratio=r["ratio_tokens_per_s"], flops_fraction=r["sides"]["mr_rl"]["flops_fraction"],
               growth=r.get("growth_mr_rl"))
    for k, v in got.items():
      goal = GOALS.get(f"{k}_{label}", GOALS.get(k))
      if v is not None and goal is not None:
        verdicts[f"{k}_{label}"] = (v, goal, v < goal if k == "growth" else v >= goal)
  res["verdicts"] = verdicts

  print(f"\nlarge fp32 matmul {', '.join(f'{x / 1e9:.1f}' for x in mm)} GFLOP/s "
        f"(start, after each size); best {peak / 1e9:.1f} is the reference")
  for label, r in res["sizes"].items():
    print(f"\n{label} ({r['params'] / 1e6:.2f}M params), medians of "
          f"{r['sides']['mr_rl']['steps_timed']} steps after {a.warmup} warm-up, load "
          f"{r['load_avg_start']} -> {r['load_avg_end']}")
    print(_table(r, peak))
    line = (f"mr_rl / TRL: {r['ratio_tokens_per_s']:.2f}x response tokens/s, "
            f"{r['ratio_step']:.2f}x steps/s")
    if "ratio_tokens_per_s_pack" in r:
      line += f"; mr_rl+pack / TRL: {r['ratio_tokens_per_s_pack']:.2f}x"
    if "growth_mr_rl" in r:
      line += (f"; cap {MAX_NEW} -> {2 * MAX_NEW}: mr_rl step {100 * r['growth_mr_rl']:+.0f}%, "
               f"TRL {100 * r['growth_trl']:+.0f}%")
    print(line)
  print("\ngoals (mr_rl): " + "; ".join(f"{k} {v:.2f} ({'<' if 'growth' in k else '>='} {g}: "
                                        f"{'met' if ok else 'NOT met'})"
                                        for k, (v, g, ok) in verdicts.items()))
  print(f"\nload average start {res['load_avg_start']}, end {res['load_avg_end']}; "
        f"total {res['seconds']:.0f} s (figures under load are indicative)")
  return report.write_json(res, a.json, announce=True)


if __name__ == "__main__":
  main()
