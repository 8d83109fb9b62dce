r"""AMRP Table 1: math reasoning, NuminaMath-1.5 10K -> MATH-500 / AMC / AIME 2024 (paper 001).

    python -m mr_rl.main --config=configs/amrp_math.py:model=qwen3_4b,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_math/model-qwen3_4b/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_math.py:model=qwen3_4b,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_math.py       # all 10 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | deepseek_math_7b (DeepSeek-Math-7B-Base);
method = base (untrained) | static (equal weights) | drbo_inverse | drbo_delta | amrp;
lora = 0 (full fine-tuning, the paper's) | 8 | 16 | 32 | 64 (LoRA of that rank on every
attention and MLP kernel, alpha = 2 x rank, lr x 10: not a paper setting; the sweep keeps
lora=0); runlocal (tiny CPU version, one step).
Rewards [accuracy, format, length]; GRPO G = 8, 32 prompts/step, lr 1e-6, clip 0.2/0.28,
one epoch (313 steps), completions up to 3,000 tokens.
TPU slice: v5p-8 (Qwen3-4B), v5p-32 (DeepSeek-Math-7B, MHA KV cache).
Estimate: 48 v5p chip-hours for the default point (model=qwen3_4b,method=amrp); whole table 667.
(configs/README.md: cost model and assumptions.)
The end-of-run eval.json scores the benchmarks MATH-500, AMC and AIME 2024 (data.eval_sets:
every record of each set, one greedy response each): eval/<set>/accuracy per set and
eval/macro/accuracy, their unweighted mean. NuminaMath is training data only.
`base_config` is also the set-up of Tables 4-7 and Figures 2-3 (amrp_algorithms, amrp_priors,
amrp_ablation, amrp_sensitivity, amrp_dynamics).
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_4b", "deepseek_math_7b"),
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp"),
           "lora": cl.LORA_RANKS}
DEFAULTS = {"model": "qwen3_4b", "method": "amrp", "lora": "0"}

# Table 1's benchmarks (mr_rl.data names): MATH-500 (500), AMC (83 x 32 replicas) and AIME 2024
# (30 x 32), each evaluated whole with one greedy response per record (App. B.1). runlocal
# points each at a tiny local file (configs/README.md, "Reproduction").
EVAL_SETS = "math500,amc,aime"
# optim.num_micro_batches per model on its slice, chosen by launch/check.py --fit.
FITTED_MICRO_BATCHES = {"qwen3_4b": 64, "deepseek_math_7b": 32}


def base_config(model: str):
  """Sec. 5.1 and App. B on paper model `model` (a config_lib.MODELS key), before the method."""
  c = cl.paper_base()   # GRPO of both papers: B 32 x G 8, lr 1e-6, clip 0.2 / 0.28, rollout T 1
  cl.set_model(c, model)                             # hub id, fp32, tensor-parallel mesh
  c.total_steps = cl.epochs_to_steps(10_000, 1)      # one epoch over 10K prompts = 313 steps
  # Training data and prompts
  c.data.name = "numina_math"                        # the 10K NuminaMath-1.5 subset
  c.data.options = dict(num_examples=10_000)         # AMRP's 10K subset (project draw rule)
  c.data.template = "amrp_math"                      # <reasoning>/<answer> system instruction
  c.data.max_prompt_len = 1024                       # problem + instruction (+ chat markup)
  c.rollout.max_new_tokens = 3000                    # max completion length 3,000
  # Micro-batches by `launch/check.py --topology=SLICE --fit` (XLA:TPU, 2026-12-06), T = 4,024:
  # Qwen3-4B on v5p-8 takes 4 rows (policy step 90.5 GB, 12% of HBM free; 8 do not compile),
  # DeepSeek-Math-7B on v5p-32 8 rows (91.5 GB, 11% free; 16 do not compile).
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES.get(model, c.optim.num_micro_batches)
  # Rewards
  c.rewards.channels = "accuracy,format,length"      # r_math = [acc, fmt, len]
  c.rewards.params = dict(length=dict(max_full=2800, zero_at=3000))  # full to 2,800, 0 at 3,000
  # Final evaluation: the benchmarks, not NuminaMath
  c.data.eval_split = "train"                        # numina has one split (evaluation: eval_sets)
  c.data.eval_sets = EVAL_SETS                       # MATH-500, AMC, AIME 2024
  c.eval.num_prompts = 2656                          # per set: all of it (AMC 83 x 32 records)
  c.eval.samples_per_prompt = 1                      # one response per instance
  c.eval.temperature = 0.0                           # greedy decoding (App. B.1)
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_math.py")
  c = base_config(a["model"])
  cl.amrp_method(c, a["method"])                     # aggregator; base: 0 steps (eval only)
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, a["model"]) if a["runlocal"] else c


def sweep(arg=None):
  swept = {k: v for k, v in CHOICES.items() if k != "lora"}  # the sweep keeps lora=0
  return cl.restrict(cl.grid(**swept), arg, CHOICES, "configs/amrp_math.py")
