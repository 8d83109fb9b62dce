"""Supervised warm start of the demo's base policy.

Trains a tiny Qwen3-layout decoder on reference solutions of the arithmetic task (a mixture of
step-by-step and direct answers, see `task`), then writes it as a Hugging Face checkpoint
(safetensors + config.json + tokenizer) with `mr_rl.models.save_pretrained`, so the RL stage
loads it exactly as it would load Qwen3 from the hub.

    python -m mr_rl.demo.warmstart --out mr_rl/demo/assets/base_policy
    python -m mr_rl.demo.warmstart --recipe=calculator --out mr_rl/demo/assets/calculator_policy

The mixture is what makes the demo meaningful: the base policy mostly reasons step by step
(long, usually right), sometimes chained (each operation once: shorter and right), sometimes
answers directly (short, often wrong), and often breaks the format, so each auxiliary channel
has a cheap shortcut to learn and `brief` also has a compatible way to be met.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from mr_rl import models
from mr_rl.demo import calculator as calculator_lib, task

PROMPT_LEN = 18        # prompts (<= 17 tokens for 7 terms) are left-padded to this bucket
RESPONSE_LEN = 48      # responses (with <eos>) are right-padded to this length
# The sampler pads prompts to a power-of-two bucket (32 for 17 tokens), so its KV cache spans
# up to 32 + 48 positions; RoPE positions themselves never exceed PROMPT_LEN + RESPONSE_LEN.
MAX_SEQ_LEN = 80


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
  """The warm start's settings; the defaults are the recipe of the shipped base policy."""
  steps: int = 3000
  batch_size: int = 64
  lr: float = 3e-3
  seed: int = 0
  min_terms: int = 2          # problems of min_terms..max_terms single-digit terms
  max_terms: int = 7
  p_direct: float = 0.3       # share of direct (no-reasoning) answers in the targets
  p_chained: float = 0.3      # share of reasoned, non-loop targets written chained (each
                              # operation once), at every chain length: the short correct style
  restate_max_terms: int = 5  # the other reasoned targets restate the question first on chains
                              # of up to this many terms (the long style; longer ones overshoot
                              # the cap), else are plain steps
  p_verbose: float = 0.0      # share of plain-step targets of <= verbose_max_terms terms
  verbose_max_terms: int = 3  # written verbosely (each step twice)
  p_loop: float = 0.3         # share of reasoned targets of >= loop_min_terms terms that fall
  loop_min_terms: int = 4     # into a loop (a step repeated up to the cap: a runaway)
  p_broken_format: float = 0.6   # share of reasoned targets whose answer is not in <a></a>
  p_sign_slip: float = 0.12   # share of targets whose (nonzero) answer has the wrong sign
  d_model: int = 128
  n_layers: int = 2
  calculator: bool = False    # targets are calculator transcripts (`mr_rl.demo.calculator`):
                              # after each </r>, its observation (not in the loss)
  p_tool: float = 0.0         # share of targets that call the calculator with the question
  init_from: str = ""         # start from this checkpoint (a directory name under
                              # mr_rl/demo/assets/, or a path) instead of random weights


RECIPE = WarmStartConfig()  # mr_rl/demo/assets/base_policy (tests check its warmstart.json)
# mr_rl/demo/assets/calculator_policy: the base policy of the multi-turn demo
# (configs/demo_tools.py), the same mixture with a quarter of the targets calling the calculator.
# Fine-tuned from the base policy: its styles stay, and it learns what follows each </r>.
CALCULATOR_RECIPE = WarmStartConfig(calculator=True, p_tool=0.25, init_from="base_policy",
                                    steps=500, lr=1e-3)
ASSETS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "assets")
RECIPES = {"base": RECIPE, "calculator": CALCULATOR_RECIPE}


def model_config(vocab_size: int, cfg: WarmStartConfig) -> models.ModelConfig:
  return models.ModelConfig(
      family="qwen3", vocab_size=vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
      n_heads=4, n_kv_heads=2, head_dim=cfg.d_model // 4, d_ff=4 * cfg.d_model,
      rope_theta=10000.0, qk_norm=True, tie_embeddings=True,
      max_seq_len=MAX_SEQ_LEN)


def target_text(problem: task.Problem, rng: np.random.Generator, cfg: WarmStartConfig) -> str:
  """One supervised target: a style drawn from the config's mixture, then its slips.

  Direct answers are a fixed template (`<r></r><a>6</a>`) and keep the format; reasoned ones
  break it at `p_broken_format`. Chained reasoning occurs at every chain length (the same
  problem is answered both long and short); the long style restates the question on chains
  of up to `restate_max_terms` terms (where it fits the cap); verbose reasoning only on short
  chains, loops only on long ones (where the base loses track).
  """
  k = len(problem.terms)
  answer = problem.answer
  if answer != 0 and rng.random() < cfg.p_sign_slip:
    answer = -answer  # a sign slip: wrong, and negative on a positive problem
  if cfg.p_tool and rng.random() < cfg.p_tool:
    return problem.solution("tool", answer=answer)
  if rng.random() < cfg.p_direct:
    return problem.solution("direct", answer=answer)
  if k >= cfg.loop_min_terms and rng.random() < cfg.p_loop:
    return problem.solution("loop", loop_step=int(rng.integers(0, k - 1)))
  if rng.random() < cfg.p_chained:
    style = "chained"
  elif k <= cfg.restate_max_terms:
    style = "restated"
  elif k <= cfg.verbose_max_terms and rng.random() < cfg.p_verbose:
    style = "verbose"
  else:
    style = "concise"
  # Answer left outside the tags: still scored by `accuracy`, fails `fmt`.
  return problem.solution(style, answer=answer,
                          broken_format=rng.random() < cfg.p_broken_format)


def encode_batch(tokenizer, prompts: list[str], responses: list[str] | None = None,
                 calculator: bool = False):
  """Left-padded prompts [B, PROMPT_LEN] (with <bos>) and right-padded responses [B, RESPONSE_LEN]
  with their mask; with `calculator`, also the loss mask [B, RESPONSE_LEN] (0 on the
  calculator's observations, which `calculator.tool_transcript` inserts after each </r>).

  A response longer than RESPONSE_LEN (with its <eos>) is cut to RESPONSE_LEN tokens without
  <eos>: a runaway target (a verbose solution of a long chain), taught as it would be sampled
  under a RESPONSE_LEN cap.
  """
  B = len(prompts)
  p_tok = np.full((B, PROMPT_LEN), tokenizer.pad_token_id, np.int32)
  p_mask = np.zeros((B, PROMPT_LEN), np.int32)
  for i, p in enumerate(prompts):
    ids = [tokenizer.bos_token_id] + tokenizer(p, add_special_tokens=False)["input_ids"]
    if len(ids) > PROMPT_LEN:
      raise ValueError(f"prompt {p!r} has {len(ids)} tokens > PROMPT_LEN {PROMPT_LEN}")
    p_tok[i, PROMPT_LEN - len(ids):] = ids
    p_mask[i, PROMPT_LEN - len(ids):] = 1
  if responses is None:
    return p_tok, p_mask
  r_tok = np.full((B, RESPONSE_LEN), tokenizer.pad_token_id, np.int32)
  r_mask = np.zeros((B, RESPONSE_LEN), np.int32)
  r_loss = np.zeros((B, RESPONSE_LEN), np.int32)
  for i, r in enumerate(responses):
    if calculator:
      ids, loss = calculator_lib.tool_transcript(prompts[i], r, tokenizer)
    else:
      ids = tokenizer(r, add_special_tokens=False)["input_ids"]
      loss = [1] * len(ids)
    ids, loss = (ids + [tokenizer.eos_token_id])[:RESPONSE_LEN], (loss + [1])[:RESPONSE_LEN]
    r_tok[i, :len(ids)] = ids
    r_mask[i, :len(ids)] = 1
    r_loss[i, :len(ids)] = loss
  return (p_tok, p_mask, r_tok, r_mask) + ((r_loss,) if calculator else ())


def _save(model, params, tokenizer, cfg, loss, out_dir):
  models.save_pretrained(model, params, out_dir)
  tokenizer.save_pretrained(out_dir)
  with open(os.path.join(out_dir, "warmstart.json"), "w") as f:
    json.dump(dataclasses.asdict(cfg) | {"final_loss": float(loss)}, f, indent=1)


def train(cfg: WarmStartConfig, out_dir: str | None = None, log_every: int = 100,
          save_every: int = 0):
  """Runs the supervised warm start; returns (model, params, tokenizer, final loss)."""
  tokenizer = task.make_tokenizer()
  vocab = int(np.ceil(len(tokenizer) / 8) * 8)
  model = models.Transformer(model_config(vocab, cfg))
  params = models.init_params(model, jax.random.PRNGKey(cfg.seed))
  if cfg.init_from:
    path = cfg.init_from if os.sep in cfg.init_from else os.path.join(ASSETS, cfg.init_from)
    start, params = models.load_pretrained(path)[:2]
    if start.config != model.config:
      raise ValueError(f"warm start init_from={path}: its model {start.config} is not this "
                       f"recipe's {model.config}")
  opt = optax.chain(optax.clip_by_global_norm(1.0),
                    optax.adamw(optax.cosine_decay_schedule(cfg.lr, cfg.steps, 0.05),
                                weight_decay=0.01))
  opt_state = opt.init(params)

  @jax.jit
  def step(params, opt_state, p_tok, p_mask, r_tok, r_mask, r_loss):
    tokens = jnp.concatenate([p_tok, r_tok], 1)
    mask = jnp.concatenate([p_mask, r_mask], 1)

    def loss_fn(params):
      logits = models.logits(model, params, tokens, mask)[:, PROMPT_LEN - 1:-1]
      logp = jax.nn.log_softmax(logits.astype(jnp.float32))
      nll = -jnp.take_along_axis(logp, r_tok[..., None], -1)[..., 0]
      return jnp.sum(nll * r_loss) / jnp.sum(r_loss)

    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  rng = np.random.default_rng(cfg.seed)
  t0, loss = time.time(), float("nan")
  for i in range(cfg.steps):
    probs = task.sample_problems(rng, cfg.batch_size, min_terms=cfg.min_terms,
                                 max_terms=cfg.max_terms)
    batch = encode_batch(tokenizer, [p.prompt for p in probs],
                         [target_text(p, rng, cfg) for p in probs], calculator=cfg.calculator)
    if not cfg.calculator:
      batch += (batch[-1],)  # the loss on every response token
    params, opt_state, loss = step(params, opt_state, *batch)
    if log_every and (i % log_every == 0 or i == cfg.steps - 1):
      print(f"warmstart step {i:5d} loss {float(loss):.4f} ({time.time() - t0:.0f}s)", flush=True)
    if out_dir is not None and save_every and (i + 1) % save_every == 0:
      _save(model, params, tokenizer, cfg, loss, out_dir)  # progress, overwritten at the end
  if out_dir is not None:
    _save(model, params, tokenizer, cfg, loss, out_dir)
  return model, params, tokenizer, float(loss)


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--out", required=True, help="checkpoint directory to write")
  ap.add_argument("--save_every", type=int, default=0, help="also save every N steps")
  ap.add_argument("--recipe", default="base", choices=sorted(RECIPES),
                  help="the defaults: base (mr_rl/demo/assets/base_policy) or calculator "
                       "(mr_rl/demo/assets/calculator_policy); the flags below override them")
  for f in dataclasses.fields(WarmStartConfig):
    kind = (lambda v: v.lower() in ("1", "true", "yes")) if f.type in (bool, "bool") else \
        type(f.default)
    ap.add_argument(f"--{f.name}", type=kind, default=None)
  args = ap.parse_args(argv)
  cfg = dataclasses.replace(RECIPES[args.recipe], **{
      f.name: getattr(args, f.name) for f in dataclasses.fields(WarmStartConfig)
      if getattr(args, f.name) is not None})
  train(cfg, args.out, save_every=args.save_every)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
