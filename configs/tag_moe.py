r"""TAG Table 10: Qwen3-30B-A3B-Instruct-2507 (MoE, 3.3B active) under 4,096-token truncation.

    python -m mr_rl.main --config=configs/tag_moe.py:task=negative,method=tag \
        --workdir=$WORKDIR_ROOT/tag_moe/task-negative/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_moe.py:task=negative,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_moe.py         # all 6 runs

Arguments: task = brief (< 512 tokens) | negative; method = rp_only | additive | tag; runlocal
(a tiny 4-expert MoE). Otherwise the tag_math set-up (Big-Math hard split).
TPU slice: v5p-32 (16 chips, mesh tensor 4 x expert 4; run launch/check.py first).
launch/check.py (grouped-matmul stand-in, docs/benchmarks.md "Paper configs on a pod"): with `model.remat` (set
here: each decoder block recomputed in the backward) the policy step needs 57 GB per chip; the
sampler (72 GB) and the reference pass (40 GB) fit. Without remat the policy step keeps every
layer's fp32 attention scores ([8 heads, 4,608, 4,608]) and routed rows: 280 GB, no fit.
`--set model.moe_impl=ep` (expert-parallel dispatch, exact) is 249 GB without remat, and its
sampler 312 GB on the CPU compile, so the config keeps 'ragged'.
Estimate: 172 v5p chip-hours for the default point (task=negative,method=tag, probes included;
remat's recomputed forward counted); whole table 813.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"task": ("brief", "negative"), "method": ("rp_only", "additive", "tag")}
DEFAULTS = {"task": "negative", "method": "tag"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_moe.py")
  c = tag_math.base_config("qwen3_30b_a3b", a["task"])
  cl.tag_method(c, a["method"], 2)
  c.model.remat = True  # the policy step fits v5p-32 only with block remat (docstring)
  return cl.runlocal(c, "qwen3_30b_a3b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_moe.py")
