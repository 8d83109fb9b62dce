"""What several paper tables share: the models, both papers' GRPO settings, the methods.

Each table's own set-up (data, prompt template, lengths, channels, steps, evaluation) is in its
config file: `base_config` of configs/amrp_math.py, amrp_alce.py, amrp_align.py, tag_math.py and
tag_code.py; the tables that vary one of those set-ups load that file (`args.load_sibling`).

Sources: the TAG summary (papers/000) for TAG; AMRP Sec. 5.1 and App. B (papers/001) for AMRP;
docs/methods.md for every rule. Values the papers leave open are marked "project" in the comments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import ml_collections

from mr_rl import settings
from mr_rl.aggregators import amrp as amrp_lib


@dataclasses.dataclass(frozen=True)
class PaperModel:
  """A model of the papers and how a run of it is laid out.

  Attributes:
    hub: Hugging Face hub id (config.model.path).
    preset: mr_rl.models preset with the same architecture (for launch/check.py, estimates).
    slice: TPU slice the configs target (validate with launch/check.py before booking).
    mesh: config.mesh (tensor parallel over the slice; the MoE adds an expert axis).
    micro_batches: config.optim.num_micro_batches for B*G = 256 rows (one row per
      data-parallel group per micro-batch).
  """
  hub: str
  preset: str
  slice: str
  mesh: Mapping[str, int]
  micro_batches: int

  @property
  def family(self) -> str:
    """The preset's model family (`mr_rl.models.families`; runlocal's tiny stand-in)."""
    from mr_rl.models import get_preset
    return get_preset(self.preset).family


def _tp(chips: int, expert: int = 1) -> dict:
  return {"data": 1, "fsdp": 1, "tensor": chips // expert, "expert": expert}


# Tensor parallelism over the slice (heads, MLP and vocabulary split over the chips) and one
# row per micro-batch and data-parallel group: at the papers' lengths (T = P + N up to 4.6K)
# one row's activations and [T, V] logits are what fills a chip (launch/check.py: Qwen3-1.7B,
# T = 4,608 on v5p-8 needs 136 GB/chip with FSDP and 4 rows per micro-batch, 42 GB with this).
MODELS: dict[str, PaperModel] = {
    # TAG (base / instruct as the summary names them)
    "qwen3_1_7b": PaperModel("Qwen/Qwen3-1.7B", "qwen3_1_7b", "v5p-8", _tp(4), 256),
    "qwen3_4b": PaperModel("Qwen/Qwen3-4B-Instruct-2507", "qwen3_4b", "v5p-8", _tp(4), 256),
    "llama3_2_3b": PaperModel("meta-llama/Llama-3.2-3B", "llama3_2_3b", "v5p-8", _tp(4), 256),
    "llama3_1_8b": PaperModel("meta-llama/Llama-3.1-8B", "llama3_1_8b", "v5p-16", _tp(8), 256),
    # 4 KV heads: tensor <= 4; experts split 4 ways (the expert axis also splits the batch).
    "qwen3_30b_a3b": PaperModel("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3_30b_a3b", "v5p-32",
                                _tp(16, expert=4), 64),
    # AMRP
    "llama3_1_8b_instruct": PaperModel("meta-llama/Llama-3.1-8B-Instruct", "llama3_1_8b",
                                       "v5p-16", _tp(8), 256),
    # MHA (32 KV heads): its fp32 KV cache for 256 x 4K tokens is ~1 TB, hence 16 chips.
    "deepseek_math_7b": PaperModel("deepseek-ai/deepseek-math-7b-base", "deepseek_math_7b",
                                   "v5p-32", _tp(16), 256),
}
MODELS_BY_HUB = {m.hub: m.slice for m in MODELS.values()}


def set_model(c, key: str) -> None:
  """Points config `c` at paper model `key` with its mesh and micro-batching."""
  m = MODELS[key]
  c.model.path = m.hub                                 # hub id (a local copy works too)
  c.model.dtype = "float32"                            # fp32 master weights: lr 1e-6 steps
                                                       # vanish in bf16 storage
  c.model.compute_dtype = "bfloat16"                   # bf16 matmuls / activations (norms,
                                                       # softmax, log-probs, losses in fp32)
  c.rollout.cache_dtype = "bfloat16"                   # the sampler in bf16 with a bf16 KV cache
  c.batch.column_buckets = 4                    # 4 learner widths: P + S/8 .. P + S
  c.mesh = ml_collections.ConfigDict(dict(m.mesh))     # tensor parallel (MoE: + expert axis)
  c.optim.num_micro_batches = m.micro_batches          # one row per micro-batch and data group


# ------------------------------------------------------------------------------ common base
def paper_base():
  """default_config() with the GRPO settings both papers share (TAG summary; AMRP Sec. 5.1)."""
  c = settings.default_config()
  c.total_steps = 500                 # TAG: 500 GRPO steps (AMRP files override by epochs)
  c.checkpoint_every = 50             # orbax checkpoint every 50 steps
  c.log_every = 10                    # console line every 10 steps (metrics.jsonl: every step)
  c.data.batch_prompts = 32           # B = 32 prompts x G = 8 = rollout batch 256
  c.rollout.group_size = 8            # G = 8
  c.rollout.temperature = 1.0         # training rollouts at T = 1 (AMRP Sec. 5.1)
  c.optim.lr = 1e-6                   # GRPO learning rate 1e-6
  c.optim.loss.eps_low = 0.2                # clip 0.2 / 0.28 (clip-higher)
  c.optim.loss.eps_high = 0.28
  c.aggregator.hp = ml_collections.ConfigDict()
  return c


def epochs_to_steps(num_prompts: int, epochs: int, batch_prompts: int = 32) -> int:
  """GRPO steps for `epochs` passes over `num_prompts` at `batch_prompts` per step."""
  return math.ceil(num_prompts * epochs / batch_prompts)


# ------------------------------------------------------------------------------- methods
def set_aggregator(c, name: str, **hp) -> None:
  """Sets aggregator `name` with hyperparameters `hp`; the others keep the rule's defaults."""
  c.aggregator.name = name
  c.aggregator.hp = ml_collections.ConfigDict(hp)


def set_amrp(c, **overrides) -> None:
  """Sets the AMRP aggregator with its paper hyperparameters, `overrides` replacing some.

  The values come from `mr_rl.aggregators.amrp.DEFAULTS`: (lambda, k_s, k_p, N) = (1, 5, 5, 1),
  rho = 0.9, eps = 1e-6, all gates on (docs/methods.md §2). They are written into
  `config.aggregator.hp` so that `show` lists them and `--config.aggregator.hp.lam=2.0` works.

  Raises:
    ValueError: an override that is not an AMRP hyperparameter.
  """
  unknown = sorted(set(overrides) - set(amrp_lib.DEFAULTS))
  if unknown:
    raise ValueError(f"set_amrp: {unknown} are not AMRP hyperparameters; valid: "
                     f"{sorted(amrp_lib.DEFAULTS)}")
  set_aggregator(c, "amrp", **{**amrp_lib.DEFAULTS, **overrides})


def amrp_method(c, method: str) -> None:
  """AMRP's Table 1-3 methods: base (no training), static, DRBO-inverse/delta, AMRP."""
  if method == "base":
    c.total_steps = 0                                  # the untrained model (eval only)
    set_aggregator(c, "additive")
  elif method == "static":
    set_aggregator(c, "additive")                      # fixed equal weights (mean-one w = 1)
  elif method in ("drbo_inverse", "drbo_delta"):
    set_aggregator(c, method, interval=25, tau=0.0,    # DRBO update interval d = 25, tau = 0
                   **({"temperature": 1.0} if method == "drbo_delta" else {}))
  elif method == "amrp":
    set_amrp(c)                                        # paper values: amrp.DEFAULTS
  else:
    raise ValueError(f"unknown AMRP method {method!r}")


TAG_METHODS = ("rp_only", "additive", "weighted", "min", "lagrangian", "pg_ot", "mo_grpo",
               "dr_grpo", "rubric_dropout", "lsc", "additive_kl", "tag")


def tag_method(c, method: str, num_channels: int, *, kl_coef: float = 0.1,
               lam: float = 1.0) -> None:
  """TAG Table 1's methods on channels (primary first, then auxiliaries)."""
  K = num_channels
  if method == "rp_only":
    set_aggregator(c, "rp_only", primary=0)            # the primary channel alone
  elif method == "additive":
    set_aggregator(c, "additive")                      # (RP + RA) / 2
  elif method == "weighted":
    if K != 2:
      raise ValueError("method 'weighted' (0.9 RP + 0.1 RA) needs two channels")
    set_aggregator(c, "weighted", w=[0.9, 0.1])        # 0.9 RP + 0.1 RA
  elif method == "min":
    set_aggregator(c, "min")                           # AND rule min(RP, RA)
  elif method == "lagrangian":
    set_aggregator(c, "lagrangian", objective=0,       # RP objective; RA >= theta constraint
                   thresholds=0.5, lr=0.1)             # project defaults (docs/methods.md §2)
  elif method == "pg_ot":
    set_aggregator(c, "pg_ot")                         # Pareto front + Sinkhorn (project def.)
  elif method == "mo_grpo":
    set_aggregator(c, "weighted", w=[1.0] * K)         # equal-weight sum of channel advantages
    c.advantage.name = "mo_grpo"                       # per-channel group normalisation
  elif method == "dr_grpo":
    set_aggregator(c, "additive")
    c.advantage.name = "dr_grpo"                       # A = R - mean_g R (no std)
    c.optim.loss.loss_agg = "seq-mean-token-sum-norm"        # constant normaliser B*G*max_len
  elif method == "rubric_dropout":
    set_aggregator(c, "rubric_dropout", p=0.5)         # drop each channel w.p. 0.5 (project def.)
  elif method == "lsc":
    set_aggregator(c, "lsc", tau=0.1)                  # soft-AND temperature (project def.)
  elif method == "additive_kl":
    set_aggregator(c, "additive")
    c.optim.loss.kl_coef = float(kl_coef)                    # beta of the k3 KL penalty to pi_0
  elif method == "tag":
    c.pipeline = "tag"                                 # probe, elect anchor by KLrev, train TAG
    c.anchor.lam = float(lam)                          # gate lambda of every auxiliary channel
    set_aggregator(c, "additive")                      # (replaced by TAG after the election)
  else:
    raise ValueError(f"unknown TAG method {method!r}; valid: {TAG_METHODS}")


def tag_probes(c) -> None:
  """TAG's anchor election (TAG summary): single-channel probes from pi_0, their drift, the gate."""
  c.anchor.probe_steps = 300                         # T = 300 single-channel GRPO steps
  c.anchor.probe_batch_prompts = 4                   # probe rollout batch 32 = 4 x G 8
  c.anchor.held_out_prompts = 256                    # drift measured on 256 held-out prompts
  c.anchor.samples_per_prompt = 1                    # one probe response per held-out prompt
  c.anchor.lam = 1.0                                 # TAG gate lambda (project default)


LORA_RANKS = ("0", "8", "16", "32", "64")  # the `lora=` argument of the paper configs


def set_lora(c, rank: int) -> None:
  """LoRA RL (mr_rl.models.lora) of rank `rank` on every attention and MLP kernel, or nothing
  for rank 0 (full fine-tuning, the papers' setting). Not a paper setting: adapters only, the
  frozen base is pi_0 (no reference copy), alpha = 2 x rank, the lr 10x the full-FT lr."""
  if rank:
    c.model.lora.rank = rank                         # R
    c.model.lora.alpha = 2.0 * rank                  # scale alpha / R = 2
    c.optim.lr = 10 * c.optim.lr                     # LoRA's usual ~10x the full-FT lr
