r"""A multi-turn GRPO step with a tool: mr_rl (TurnRollout + GRPO update) vs TRL's GRPOTrainer(tools=).

The task, the same on both sides: B prompts "What is a+b?" x G trajectories, a `calculator`
tool that sleeps `--latency-ms` before answering, `--turns` policy turns (the first `turns - 1`
end in a call, which runs; the last call is not run: TRL's loop stops after
`max_tool_calling_iterations = turns - 1`), `S` response columns (sampled and tool ids) for
both, temperature 1, reward -|L - target| on the response columns L (sampled + tool ids; it
varies with the turn lengths, so advantages are not 0), AdamW lr 2e-4, clip 0.2 / 0.28,
token-mean loss (TRL `loss_type="dapo"`), no KL, one optimizer step per batch, as
benchmarks/rl_step.py.

The model: the demo's Qwen3 shape (d 128, 2 layers, 4 / 2 heads of 32, d_ff 512), written by
transformers, with a byte-level BPE tokenizer (mr_rl.tiny_assets's corpus plus the tool prompt),
Qwen3-4B-Instruct-2507's chat template as TRL ships it (TRL then sets its Qwen3 response
parser; mr_rl's `ChatRenderer` takes it: append-only) and Qwen's tool tokens. TRL's parser
finds a call only when `<tool_call>` and `</tool_call>` are tokens of their own, and a random
model never writes one, so the weights are scripted: the body is transformers' random init,
the embeddings and the head make a bigram policy over a chain (after the prompt's last token:
filler words, each followed by the next with probability 1 - 1/F or by the call with 1/F, at
most 2F words; then `<tool_call>`, the call's three JSON pieces, `</tool_call>`, `<|im_end|>`).
Compute per token is that of any model of the shape; turn lengths are ragged (mean ~F + 6).

Per (turns, latency): `--warmup` + `--steps` steps, alternating sides step by step
(benchmarks/rl_step.py's baton: steps never overlap); medians of the timed steps: s/step,
rollout s (mr_rl: `collect.draw`; TRL: `_generate`, its tool loop inside) and sampled tokens/s
of the rollout; rest = step - rollout (rewards, advantages, batch, the update). TRL runs the
tools of a round one after another (a sync tool in a Python loop; an async tool is awaited per
trajectory), and re-prefills each history every turn. `--trl-cb`: TRL generates with
transformers' continuous batching (`generate_batch`), built for GPUs.

  python benchmarks/multiturn_trl.py --quick
  python benchmarks/multiturn_trl.py --turns 4,8 --latency-ms 0,50 --json /tmp/mt_trl.json
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import tempfile
import time

import numpy as np

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))
sys.path.insert(0, _HERE)
import report  # noqa: E402
import rl_step  # noqa: E402  (Baton, run_alternating)

SHAPE = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=32, intermediate_size=512)  # the demo policy's (mr_rl/demo)
TOOL_TOKENS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
CALL_PIECES = ('\n{"name": "calculator", "arguments": {"expression": "', "7+5", '"}}\n')
EOT = "<|im_end|>"
LR = 2e-4


def make_calculator(latency_s: float):
  """`calculator(expression)`: mr_rl's built-in calculator after `latency_s` of sleep."""
  from mr_rl.multiturn import builtin_tools

  def calculator(expression: str) -> str:
    """Evaluates an arithmetic expression.

    Args:
      expression: numbers with + - * / // % and parentheses, e.g. '7+5-9'.
    """
    time.sleep(latency_s)
    return builtin_tools.calculator(expression)
  return calculator


def prompts(n: int) -> list[list[dict]]:
  return [[{"role": "user", "content": f"What is {3 + i % 7}+{2 + i % 5}?"}] for i in range(n)]


# ---------------------------------------------------------------------------- checkpoint
def write_tokenizer(out_dir: str, vocab_size: int = 1024):
  """The BPE tokenizer (module docstring), saved to `out_dir`; returns it."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  from transformers import AutoTokenizer, PreTrainedTokenizerFast
  from trl.chat_template_utils import qwen3_instruct_2507_chat_template as template
  from mr_rl.tiny_assets import tokenizer as tiny
  special = ["<|endoftext|>", "<|im_start|>", EOT]
  kw = dict(eos_token=EOT, pad_token="<|endoftext|>", chat_template=template)
  probe = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE()), **kw)
  text = probe.apply_chat_template(prompts(1)[0], tools=[make_calculator(0)], tokenize=False,
                                   add_generation_prompt=True)
  tok = Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(tiny.corpus() + [text] * 4, trainers.BpeTrainer(
      vocab_size=vocab_size, special_tokens=special, show_progress=False,
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, model_max_length=4096, **kw)
  fast.add_tokens(list(TOOL_TOKENS) + list(CALL_PIECES))
  fast.save_pretrained(out_dir)
  return AutoTokenizer.from_pretrained(out_dir)


def write_scripted_qwen3(out_dir: str, filler: int, seed: int = 0, scale: float = 100.0) -> dict:
  """Writes the scripted checkpoint (module docstring) with its tokenizer to `out_dir`; returns
  {path, prompt_len, chain}. Chain token k's embedding is `scale` * sqrt(d) * u_k (u_k
  orthonormal), so the residual stream is that embedding up to the body's small outputs and
  the final norm gives sqrt(d) u_k; the head W = T^T U^T / sqrt(d) then gives logits T[k]."""
  import torch
  from transformers import Qwen3Config, Qwen3ForCausalLM
  tok = write_tokenizer(out_dir)
  first = tok.apply_chat_template(prompts(1)[0], tools=[make_calculator(0)], tokenize=True,
                                  add_generation_prompt=True, return_dict=False)
  rng = np.random.default_rng(seed)
  words = sorted(i for t, i in tok.get_vocab().items() if re.fullmatch(r"Ġ?[a-z]{2,}", t))
  cap = 2 * filler
  fill = [int(x) for x in rng.choice(words, cap, replace=False)]
  call = [tok.convert_tokens_to_ids(t) for t in (TOOL_TOKENS[0],) + CALL_PIECES + TOOL_TOKENS[1:2]]
  eot = tok.convert_tokens_to_ids(EOT)
  chain = [first[-1]] + fill + call  # the prompt's (and every observation's) last token first
  nxt = chain[1:] + [eot]
  V, d = len(tok), SHAPE["hidden_size"]
  T = np.full((len(chain), V), -30.0)
  for k, y in enumerate(nxt):
    T[k, y] = 0.0
    if 1 <= k < cap:  # a filler word: the call comes next with probability 1 / filler
      T[k, call[0]] = np.log(1.0 / (filler - 1))
  cfg = Qwen3Config(vocab_size=V, max_position_embeddings=2048, rms_norm_eps=1e-6,
                    tie_word_embeddings=False, eos_token_id=eot, pad_token_id=tok.pad_token_id,
                    bos_token_id=None, **SHAPE)
  torch.manual_seed(seed)
  model = Qwen3ForCausalLM(cfg).to(torch.float32)
  U = np.linalg.qr(rng.standard_normal((d, d)))[0][:, :len(chain)]
  with torch.no_grad():
    E = model.model.embed_tokens.weight
    for k, x in enumerate(chain):
      E[x] = torch.tensor(scale * np.sqrt(d) * U[:, k], dtype=torch.float32)
    model.lm_head.weight.copy_(torch.tensor(T.T @ U.T / np.sqrt(d), dtype=torch.float32))
  model.save_pretrained(out_dir)
  return dict(path=out_dir, prompt_len=len(first), chain=len(chain), vocab=V)


# -------------------------------------------------------------------------------- mr_rl
class MrRlSide:
  """mr_rl's multi-turn GRPO step from its components (`collect.draw`, `signal_fn`,
  `make_batch(policy_mask_BGS=)`, `learner`): the trainer's wiring of `config.multiturn` is
  not there yet."""

  def __init__(self, path: str, a, steps: int):
    import jax
    from transformers import AutoTokenizer
    from transformers.utils import get_json_schema
    from mr_rl import models
    from mr_rl.multiturn import env as env_lib, render as render_lib, rollout as mt, tools
    from mr_rl.rl import losses, signal as signal_lib, update as update_lib
    self.name, self.baton, self.a, self.steps, self.rec = "mr_rl", rl_step.Baton("mr_rl"), a, \
        steps, []
    tok = AutoTokenizer.from_pretrained(path)
    calc = make_calculator(a.latency_s)
    self.render = render_lib.ChatRenderer(tok, end_of_turn=EOT, tools=[get_json_schema(calc)])
    self.model, params = models.load_pretrained(path)[:2]
    rows = a.prompts * a.group

    class Env(tools.ToolEnv):  # the last turn's call is not run (TRL's loop stops there)
      def step(self, turn):
        if turn.index + 1 >= a.turns:
          return env_lib.StepResult(done=True, info={"tool_calls": 0})
        return super().step(turn)

    self.make_env = lambda: Env([calc])
    self.engine = mt.TurnRollout(
        self.model, slots=rows, max_new_tokens=a.budget, end_of_turn_ids=[tok.eos_token_id],
        limits=mt.TurnLimits(a.turns, 32, max(30.0, 20 * a.latency_s)), workers=rows)
    cfg = update_lib.UpdateConfig(loss=losses.PolicyLossConfig(eps_low=0.2, eps_high=0.28,
                                                               loss_agg="token-mean"),
                                  lr=LR, weight_decay=0.0, max_grad_norm=1.0)
    self.learner = update_lib.learner(self.model, cfg)
    self.agg, self.signal = signal_lib.signal_fn("additive", {}, "grpo")
    self.state = self.learner.init(params, jax.random.PRNGKey(1))
    self.prompt_ids = [self.render.prompt_ids(m) for m in prompts(a.prompts * steps)]

  def run(self, baton) -> None:
    import jax
    from mr_rl import compilation
    from mr_rl.multiturn import collect
    from mr_rl.rl import batch as batch_lib
    a, B = self.a, self.a.prompts
    agg_state, compiles = self.agg.init(1), compilation.StepCompiles()
    for step in range(self.steps):
      k_roll, k_agg, k_upd = jax.random.split(jax.random.fold_in(jax.random.PRNGKey(0), step), 3)
      examples = [{"messages": m} for m in prompts(B * self.steps)[step * B:(step + 1) * B]]
      t0 = time.perf_counter()
      d = collect.draw(self.engine, self.learner.policy(self.state, None), examples,
                       self.make_env, self.render, group_size=a.group, key=k_roll,
                       env_channels=("tool_format",))
      t1 = time.perf_counter()
      L = np.array([len(t.tokens) for t in d.trajectories], np.float32)
      r_BGK = -np.abs(L - a.target).reshape(B, a.group, 1)
      sig = self.signal(agg_state, r_BGK, k_agg)
      agg_state = sig.agg_state
      batch = batch_lib.make_batch(d.rollout, np.asarray(sig.A_BG),
                                   policy_mask_BGS=d.policy_mask_BGS)
      self.state, m = self.learner.update(self.state, self.learner.place_batch(batch), k_upd,
                                          None)
      jax.block_until_ready(m)
      st = self.engine.last_stats
      self.rec.append(dict(
          rollout_s=t1 - t0, sampled=int(d.policy_mask_BGS.sum()), columns=float(L.mean()),
          turns=float(np.mean([t.turns for t in d.trajectories])),
          tool_calls=float(sum(t.info.get("tool_calls", 0) for t in d.trajectories)),
          slot_utilization=st.slot_utilization, waiting_share=st.waiting_share,
          compile_s=compiles.take(None)["compile/seconds"],
          statuses=sorted({t.status for t in d.trajectories})))
      baton.step_done()


# ---------------------------------------------------------------------------------- TRL
class TrlSide:
  """TRL's GRPOTrainer with `tools=[calculator]` on the same checkpoint and prompts."""

  def __init__(self, path: str, a, steps: int, workdir: str, check_ids=None):
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, \
        TrainerCallback
    from trl import GRPOConfig, GRPOTrainer
    self.name, self.baton, self.rec = "trl", rl_step.Baton("trl"), []
    tok = AutoTokenizer.from_pretrained(path)
    calc = make_calculator(a.latency_s)
    msgs = prompts(a.prompts * steps)
    if check_ids is not None:  # the very prompt ids mr_rl feeds its rollout
      for m, ids in zip(msgs, check_ids):
        got = tok.apply_chat_template(m, tools=[calc], tokenize=True, return_dict=False,
                                      add_generation_prompt=True)
        if list(got) != list(ids):
          raise ValueError(f"TRL's prompt ids {got} are not mr_rl's {ids}")
    args = GRPOConfig(
        output_dir=workdir, use_cpu=True, report_to="none", seed=0, max_steps=steps,
        per_device_train_batch_size=a.prompts * a.group, num_generations=a.group,
        gradient_accumulation_steps=1, num_iterations=1, max_completion_length=a.budget,
        max_tool_calling_iterations=a.turns - 1, temperature=1.0, top_p=1.0, top_k=0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
        max_grad_norm=1.0, epsilon=0.2, epsilon_high=0.28, loss_type="dapo", beta=0.0,
        scale_rewards="group", shuffle_dataset=False, save_strategy="no", disable_tqdm=True,
        log_completions=False, bf16=False, fp16=False, dataloader_num_workers=0,
        use_transformers_continuous_batching=a.trl_cb)
    rec, baton, target = self.rec, self.baton, a.target

    class Timed(GRPOTrainer):
      def _generate(self, prompts_):
        t0 = time.perf_counter()
        out = super()._generate(prompts_)
        tool_mask = out[2]
        rec.append(dict(rollout_s=time.perf_counter() - t0,
                        sampled=int(sum(sum(m) for m in tool_mask)),
                        columns=float(np.mean([len(c) for c in out[1]])),
                        turns=float(np.mean([sum(1 for x in c if x["role"] == "assistant")
                                             for c in out[3]])),
                        tool_calls=float(sum(sum(1 for x in c if x["role"] == "tool")
                                             for c in out[3]))))
        return out

    class StepEnd(TrainerCallback):
      def on_step_end(self, args, state, control, **kw):
        baton.step_done()

    def length_reward(prompts, completions, completion_ids, **_):
      return [-abs(len(ids) - target) for ids in completion_ids]

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    self.trainer = Timed(model=model, reward_funcs=[length_reward], args=args,
                         train_dataset=datasets.Dataset.from_dict({"prompt": msgs}),
                         processing_class=tok, tools=[calc], callbacks=[StepEnd()])
    self.trainer.remove_callback(PrinterCallback)
    if self.trainer.chat_template is not None:
      raise ValueError("TRL replaced the chat template: the two sides would see other ids")

  def run(self, baton) -> None:
    self.trainer.train()


# ---------------------------------------------------------------------------------- main
def summarize(side, warmup: int) -> dict:
  if len(side.rec) != len(side.baton.step_s):
    raise RuntimeError(f"{side.name}: {len(side.baton.step_s)} steps, {len(side.rec)} rollouts")
  recs = [dict(r, step_s=s) for r, s in zip(side.rec, side.baton.step_s)][warmup:]
  med = lambda f: statistics.median(f(r) for r in recs)
  out = dict(step_s=med(lambda r: r["step_s"]), rollout_s=med(lambda r: r["rollout_s"]),
             rest_s=med(lambda r: r["step_s"] - r["rollout_s"]),
             rollout_tokens_per_s=med(lambda r: r["sampled"] / r["rollout_s"]),
             sampled_per_step=med(lambda r: r["sampled"]), steps=recs)
  for k in ("columns", "turns", "tool_calls", "slot_utilization", "waiting_share", "compile_s"):
    if k in recs[0]:
      out[k] = float(np.mean([r[k] for r in recs]))
  return out


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--prompts", type=int, default=8, help="B")
  p.add_argument("--group", type=int, default=8, help="G")
  p.add_argument("--turns", default="4,8")
  p.add_argument("--latency-ms", default="0,50")
  p.add_argument("--filler", type=int, default=16, help="F: mean filler words per turn")
  p.add_argument("--steps", type=int, default=3, help="timed steps per side")
  p.add_argument("--warmup", type=int, default=1)
  p.add_argument("--trl-cb", action="store_true",
                 help="TRL generates with transformers' continuous batching (generate_batch)")
  p.add_argument("--quick", action="store_true", help="B 2, G 4, 3 turns, 0 and 50 ms, 1+1")
  p.add_argument("--json")
  a = p.parse_args(argv)
  if a.quick:
    a.prompts, a.group, a.turns, a.latency_ms, a.steps, a.warmup = 2, 4, "3", "0,50", 1, 1
  import warnings
  import transformers
  transformers.logging.set_verbosity_error()
  warnings.filterwarnings("ignore", category=FutureWarning)
  os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
  res = dict(args=vars(a), load_avg_start=report.load_avg(), configs=[])
  with tempfile.TemporaryDirectory() as tmp:
    ck = write_scripted_qwen3(os.path.join(tmp, "ckpt"), a.filler)
    res["checkpoint"] = {k: v for k, v in ck.items() if k != "path"}
    print(f"scripted Qwen3 {SHAPE}, vocab {ck['vocab']}, prompt {ck['prompt_len']} ids; "
          f"load {res['load_avg_start']}", flush=True)
    for turns in [int(x) for x in a.turns.split(",")]:
      for ms in [float(x) for x in a.latency_ms.split(",")]:
        a.turns, a.latency_s = turns, ms / 1000
        # S: every turn at its cap (2F filler + 6 call ids) plus a 14-id observation
        a.budget = turns * (2 * a.filler + 6 + 14) + 8
        a.target = turns * (a.filler + 6 + 14)
        steps = a.warmup + a.steps
        load0 = report.load_avg()
        mr = MrRlSide(ck["path"], a, steps)
        trl = TrlSide(ck["path"], a, steps, os.path.join(tmp, "trl"), check_ids=mr.prompt_ids)
        rl_step.run_alternating([mr, trl], steps)
        row = dict(turns=turns, latency_ms=ms, budget=a.budget, load_avg_start=load0,
                   load_avg_end=report.load_avg(), mr_rl=summarize(mr, a.warmup),
                   trl=summarize(trl, a.warmup))
        m, t = row["mr_rl"], row["trl"]
        row["step_ratio"] = t["step_s"] / m["step_s"]
        row["rollout_ratio"] = m["rollout_tokens_per_s"] / t["rollout_tokens_per_s"]
        res["configs"].append(row)
        print(f"turns {turns} latency {ms:3.0f} ms | mr_rl step {m['step_s']:6.2f} s (rollout "
              f"{m['rollout_s']:5.2f} s, {m['rollout_tokens_per_s']:7.0f} tok/s, util "
              f"{m['slot_utilization']:.2f}, rest {m['rest_s']:5.2f} s) | TRL step "
              f"{t['step_s']:6.2f} s (rollout {t['rollout_s']:5.2f} s, "
              f"{t['rollout_tokens_per_s']:7.0f} tok/s, rest {t['rest_s']:5.2f} s) | step "
              f"{row['step_ratio']:.2f}x, rollout tok/s {row['rollout_ratio']:.2f}x | turns "
              f"{m['turns']:.1f}/{t['turns']:.1f}, calls {m['tool_calls']:.0f}/"
              f"{t['tool_calls']:.0f}, columns {m['columns']:.0f}/{t['columns']:.0f} | load "
              f"{row['load_avg_end'][0]}", flush=True)
  res["load_avg_end"] = report.load_avg()
  return report.write_json(res, a.json, announce=True)


if __name__ == "__main__":
  main()
