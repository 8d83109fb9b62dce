"""The papers' models, shared GRPO settings, methods and per-table set-ups (every field commented).

Sources: the TAG summary (papers/000) for TAG; AMRP Sec. 5.1 and App. B (papers/001) for AMRP;
METHODS.md for every rule. Values the papers leave open are marked "project" in the comments.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping

import ml_collections

from mr_rl import settings


@dataclasses.dataclass(frozen=True)
class PaperModel:
  """A model of the papers and how a run of it is laid out.

  Attributes:
    hub: Hugging Face hub id (config.model.path).
    preset: mr_rl.models preset with the same architecture (for launch/check.py, estimates).
    family: tiny stand-in family for runlocal.
    slice: TPU slice the configs target (validate with launch/check.py before booking).
    mesh: config.mesh (tensor parallel over the slice; the MoE adds an expert axis).
    micro_batches: config.optim.num_micro_batches for B*G = 256 rows (one row per
      data-parallel group per micro-batch).
  """
  hub: str
  preset: str
  family: str
  slice: str
  mesh: Mapping[str, int]
  micro_batches: int


def _tp(chips: int, expert: int = 1) -> dict:
  return {"data": 1, "fsdp": 1, "tensor": chips // expert, "expert": expert}


# Tensor parallelism over the slice (heads, MLP and vocabulary split over the chips) and one
# row per micro-batch and data-parallel group: at the papers' lengths (T = P + N up to 4.6K)
# one row's activations and [T, V] logits are what fills a chip (launch/check.py: Qwen3-1.7B,
# T = 4,608 on v5p-8 needs 136 GB/chip with FSDP and 4 rows per micro-batch, 42 GB with this).
MODELS: dict[str, PaperModel] = {
    # TAG (base / instruct as the summary names them)
    "qwen3_1_7b": PaperModel("Qwen/Qwen3-1.7B", "qwen3_1_7b", "qwen3", "v5p-8", _tp(4), 256),
    "qwen3_4b": PaperModel("Qwen/Qwen3-4B-Instruct-2507", "qwen3_4b", "qwen3", "v5p-8", _tp(4),
                           256),
    "llama3_2_3b": PaperModel("meta-llama/Llama-3.2-3B", "llama3_2_3b", "llama", "v5p-8", _tp(4),
                              256),
    "llama3_1_8b": PaperModel("meta-llama/Llama-3.1-8B", "llama3_1_8b", "llama", "v5p-16", _tp(8),
                              256),
    # 4 KV heads: tensor <= 4; experts split 4 ways (the expert axis also splits the batch).
    "qwen3_30b_a3b": PaperModel("Qwen/Qwen3-30B-A3B-Instruct-2507", "qwen3_30b_a3b", "qwen3_moe",
                                "v5p-32", _tp(16, expert=4), 64),
    # AMRP
    "llama3_1_8b_instruct": PaperModel("meta-llama/Llama-3.1-8B-Instruct", "llama3_1_8b", "llama",
                                       "v5p-16", _tp(8), 256),
    # MHA (32 KV heads): its fp32 KV cache for 256 x 4K tokens is ~1 TB, hence 16 chips.
    "deepseek_math_7b": PaperModel("deepseek-ai/deepseek-math-7b-base", "deepseek_math_7b",
                                   "llama", "v5p-32", _tp(16), 256),
}
MODELS_BY_HUB = {m.hub: m.slice for m in MODELS.values()}


def set_model(c, key: str) -> None:
  """Points config `c` at paper model `key` with its mesh and micro-batching."""
  m = MODELS[key]
  c.model.path = m.hub                                 # hub id (a local copy works too)
  c.model.dtype = "float32"                            # fp32 params: lr 1e-6 steps vanish in bf16
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
  c.loss.eps_low = 0.2                # clip 0.2 / 0.28 (clip-higher)
  c.loss.eps_high = 0.28
  c.aggregator.hp = ml_collections.ConfigDict()
  return c


def epochs_to_steps(num_prompts: int, epochs: int, batch_prompts: int = 32) -> int:
  """GRPO steps for `epochs` passes over `num_prompts` at `batch_prompts` per step."""
  return math.ceil(num_prompts * epochs / batch_prompts)


# ------------------------------------------------------------------------------- methods
AMRP_DEFAULTS = dict(lam=1.0, k_s=5.0, k_p=5.0, interval=1, rho=0.9, eps=1e-6)


def set_aggregator(c, name: str, **hp) -> None:
  c.aggregator.name = name
  c.aggregator.hp = ml_collections.ConfigDict(hp)


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
    set_aggregator(c, "amrp", **AMRP_DEFAULTS)         # (lambda, k_s, k_p, N) = (1, 5, 5, 1)
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
                   thresholds=0.5, lr=0.1)             # project defaults (METHODS.md 2)
  elif method == "pg_ot":
    set_aggregator(c, "pg_ot")                         # Pareto front + Sinkhorn (project def.)
  elif method == "mo_grpo":
    set_aggregator(c, "weighted", w=[1.0] * K)         # equal-weight sum of channel advantages
    c.advantage.name = "mo_grpo"                       # per-channel group normalisation
  elif method == "dr_grpo":
    set_aggregator(c, "additive")
    c.advantage.name = "dr_grpo"                       # A = R - mean_g R (no std)
    c.loss.loss_agg = "seq-mean-token-sum-norm"        # constant normaliser B*G*max_len
  elif method == "rubric_dropout":
    set_aggregator(c, "rubric_dropout", p=0.5)         # drop each channel w.p. 0.5 (project def.)
  elif method == "lsc":
    set_aggregator(c, "lsc", tau=0.1)                  # soft-AND temperature (project def.)
  elif method == "additive_kl":
    set_aggregator(c, "additive")
    c.loss.kl_coef = float(kl_coef)                    # beta of the k3 KL penalty to pi_0
  elif method == "tag":
    c.pipeline = "tag"                                 # probe, elect anchor by KLrev, train TAG
    c.anchor.lam = float(lam)                          # gate lambda of every auxiliary channel
    set_aggregator(c, "additive")                      # (replaced by TAG after the election)
  else:
    raise ValueError(f"unknown TAG method {method!r}; valid: {TAG_METHODS}")


# ---------------------------------------------------------------------- paper set-ups
def _cd(**kw):
  return ml_collections.ConfigDict(kw)


# AMRP Table 1's benchmarks (mr_rl.data names): MATH-500 (500), AMC (83 x 32 replicas) and
# AIME 2024 (30 x 32), each evaluated whole with one greedy response per record (App. B.1).
# For config.data.eval_sets of amrp_math_base (with eval.num_prompts = 2656, AMC's size) once
# runlocal points the sets at tiny local files (configs/README.md, "AMRP Table 1").
AMRP_MATH_EVAL_SETS = "math500,amc,aime"


def amrp_math_base(model_key: str):
  """AMRP math reasoning (Sec. 5.1, App. B): NuminaMath-1.5 10K, [accuracy, format, length]."""
  c = paper_base()
  set_model(c, model_key)
  c.total_steps = epochs_to_steps(10_000, 1)         # one epoch over 10K prompts = 313 steps
  c.data.name = "numina_math"                        # the 10K NuminaMath-1.5 subset
  c.data.eval_split = "train"                        # numina has one split (evaluation: eval_sets)
  c.data.eval_sets = AMRP_MATH_EVAL_SETS             # final eval: MATH-500, AMC, AIME 2024
  c.data.template = "amrp_math"                      # <reasoning>/<answer> system instruction
  c.data.max_prompt_len = 1024                       # problem + instruction (+ chat markup)
  c.data.options = _cd(num_examples=10_000)          # AMRP's 10K subset (project draw rule)
  c.rollout.max_new_tokens = 3000                    # max completion length 3,000
  c.rewards.channels = "accuracy,format,length"      # r_math = [acc, fmt, len]
  c.rewards.params = _cd(length=_cd(max_full=2800, zero_at=3000))  # full to 2,800, 0 at 3,000
  c.eval.num_prompts = 2656                          # per set: all of it (AMC 83 x 32 records)
  c.eval.samples_per_prompt = 1                      # one response per instance
  c.eval.temperature = 0.0                           # greedy decoding (App. B.1)
  return c


ALCE_TRAIN = {"asqa": 758, "eli5": 800}              # 80/20 split of ALCE (App. B.1)
ALCE_TEST = {"asqa": 190, "eli5": 200}
ALCE_MAX_NEW = {"asqa": 400, "eli5": 500}


def amrp_alce_base(model_key: str, dataset: str):
  """AMRP citation-grounded QA (ALCE ASQA / ELI5): [correctness, citation]."""
  c = paper_base()
  set_model(c, model_key)
  c.total_steps = epochs_to_steps(ALCE_TRAIN[dataset], 3)  # three epochs (72 / 75 steps)
  c.checkpoint_every = 25                            # short runs: checkpoint every 25 steps
  c.data.name = f"alce_{dataset}"                    # 3 passages + 1 demonstration per prompt
  c.data.template = "alce"                           # the ALCE prompt carries its instruction
  c.data.max_prompt_len = 2048                       # instruction + demo + 3 passages + query
  c.rollout.max_new_tokens = ALCE_MAX_NEW[dataset]   # 400 (ASQA) / 500 (ELI5) tokens
  c.rewards.channels = "alce_correctness,alce_citation"  # STR-EM or claims-NLI; AutoAIS F1
  c.rewards.timeout_s = 120.0                        # NLI verifier on the reward host
  c.eval.num_prompts = ALCE_TEST[dataset]            # the held-out 20% (190 / 200)
  c.eval.samples_per_prompt = 1                      # one sampled response per prompt
  c.eval.temperature = 1.0                           # ALCE responses sampled at T = 1
  return c


HELPSTEER2_PROMPTS = 10_162  # ~20,324 train rows with about two responses per prompt (assumed)
ARMORM_CHANNELS = "armorm_helpfulness,armorm_correctness,armorm_coherence"


def amrp_align_base(model_key: str):
  """AMRP open-ended alignment: HelpSteer2 prompts, ArmoRM [helpfulness, correctness, coherence]."""
  c = paper_base()
  set_model(c, model_key)
  c.total_steps = epochs_to_steps(HELPSTEER2_PROMPTS, 3)  # three epochs (~953 steps)
  c.data.name = "helpsteer2"                         # unique HelpSteer2 prompts, chat turns
  c.data.eval_split = "validation"                   # held-out HelpSteer2 prompts
  c.data.template = "helpsteer2"                     # no extra instruction
  c.data.max_prompt_len = 4096                       # some prompts hold long documents
  c.rollout.max_new_tokens = 512                     # max completion length 512
  c.rewards.channels = ARMORM_CHANNELS               # ArmoRM-Llama3-8B-v0.1 objectives 0 / 1 / 2
  rm = dict(rescale="helpsteer",                     # rating / 4 in [0, 1] (App. B.2; project map)
            dtype="bfloat16",                        # the 8B scorer in bf16 (inference only)
            mesh=dict(MODELS[model_key].mesh))       # sharded over the policy's devices
  c.rewards.params = _cd(**{ch: _cd(**rm) for ch in ARMORM_CHANNELS.split(",")})  # one shared RM
  c.rewards.timeout_s = 300.0                        # first call loads and compiles the RM
  c.eval.samples_per_prompt = 1                      # one response per prompt
  c.eval.temperature = 0.0                           # greedy (App. B.1)
  return c


BRIEF_THRESHOLD = {"qwen3": 200, "llama": 128, "qwen3_moe": 512}  # TAG: tokens, per model family
TAG_MATH_CHANNELS = {"brief": "accuracy,brief", "negative": "accuracy,negative",
                     "three": "accuracy,brief,negative"}


def tag_common(c) -> None:
  c.anchor.probe_steps = 300                         # T = 300 single-channel GRPO steps
  c.anchor.probe_batch_prompts = 4                   # probe rollout batch 32 = 4 x G 8
  c.anchor.held_out_prompts = 256                    # drift measured on 256 held-out prompts
  c.anchor.samples_per_prompt = 1                    # one probe response per held-out prompt
  c.anchor.lam = 1.0                                 # TAG gate lambda (project default)


def tag_math_base(model_key: str, task: str, subset: str = "auto"):
  """TAG math: Big-Math hard (Qwen) / Llama-calibrated (Llama), accuracy + brief / negative."""
  c = paper_base()
  set_model(c, model_key)
  family = MODELS[model_key].family
  if subset == "auto":
    subset = "llama_calibrated" if family == "llama" else "hard"
  c.data.name = f"big_math_{subset}"                 # Big-Math-RL-Verified band (project cut)
  c.data.template = "tag_math"                       # "... final answer within \boxed{}"
  c.data.max_prompt_len = 512                        # problem + instruction
  c.rollout.max_new_tokens = 4096                    # 4,096 (stated for Qwen3-30B; used for all)
  c.rewards.channels = TAG_MATH_CHANNELS[task]       # RP = accuracy first, then auxiliaries
  if "brief" in c.rewards.channels:
    c.rewards.params = _cd(brief=_cd(threshold=BRIEF_THRESHOLD[family]))  # < 200/128/512 tokens
  c.eval.num_prompts = 1500                          # the whole test split (1,498 / 1,500)
  c.eval.samples_per_prompt = 4                      # 4 samples: pass@4 and pass@1
  tag_common(c)
  return c


CODE_AUX = {"fast": "code_fast", "noop": "code_noop"}


def tag_code_base(model_key: str, task: str):
  """TAG code synthesis: DeepCoder, correctness + fast (< 60 ms) / no-op (< 3 ms)."""
  c = paper_base()
  set_model(c, model_key)
  c.data.name = "deepcoder"                          # DeepCoder-Preview, stdio problems
  c.data.template = "tag_code"                       # one ```python block, stdin -> stdout
  c.data.max_prompt_len = 2048                       # problem statements with examples
  c.rollout.max_new_tokens = 4096                    # project choice (not in the summary)
  aux = CODE_AUX[task]
  c.rewards.channels = f"code_correct,{aux}"         # RP = all tests pass; RA = runtime
  c.rewards.params = _cd(**{"code_correct": _cd(timeout_s=10.0),  # 10 s per (small) test
                            aux: _cd(timeout_s=10.0,  # same sandbox run as code_correct
                                     threshold_ms=60.0 if task == "fast" else 3.0)})
  c.rewards.timeout_s = 600.0                        # one program's whole test run
  c.eval.num_prompts = 185                           # DeepCoder-RT test size
  c.eval.samples_per_prompt = 8                      # n = 8 samples (unbiased pass@4)
  tag_common(c)
  return c
