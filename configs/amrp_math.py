r"""AMRP Table 1: math reasoning, NuminaMath-1.5 10K -> MATH-500 / AMC / AIME 2024 (paper 001).

    python -m mr_rl.main --config=configs/amrp_math.py:model=qwen3_4b,method=amrp \
        --workdir=$WORKDIR_ROOT/amrp_math/model-qwen3_4b/method-amrp
    launch/pod.sh $TPU $ZONE configs/amrp_math.py:model=qwen3_4b,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_math.py       # all 10 runs of the table

Arguments: model = qwen3_4b (Qwen3-4B-Instruct-2507) | deepseek_math_7b (DeepSeek-Math-7B-Base);
method = base (untrained) | static (equal weights) | drbo_inverse | drbo_delta | amrp;
runlocal (tiny CPU version, one step).
Rewards [accuracy, format, length]; GRPO G = 8, 32 prompts/step, lr 1e-6, clip 0.2/0.28,
one epoch (313 steps), completions up to 3,000 tokens.
TPU slice: v5p-8 (Qwen3-4B), v5p-32 (DeepSeek-Math-7B, MHA KV cache).
Estimate: 48 v5p chip-hours for the default point (model=qwen3_4b,method=amrp); whole table 667.
(configs/README.md: cost model and assumptions.)
The end-of-run eval.json scores training prompts (NuminaMath has one split); the MATH-500 /
AMC / AIME numbers need the benchmark evaluation described in configs/README.md.
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_4b", "deepseek_math_7b"),
           "method": ("base", "static", "drbo_inverse", "drbo_delta", "amrp")}
DEFAULTS = {"model": "qwen3_4b", "method": "amrp"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_math.py")
  c = cl.amrp_math_base(a["model"])
  cl.amrp_method(c, a["method"])
  if a["runlocal"]:
    cl.runlocal(c, a["model"])
  return c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_math.py")
