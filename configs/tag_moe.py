r"""TAG Table 10: Qwen3-30B-A3B-Instruct-2507 (MoE, 3.3B active) under 4,096-token truncation.

    python -m mr_rl.main --config=configs/tag_moe.py:task=negative,method=tag \
        --workdir=$WORKDIR_ROOT/tag_moe/task-negative/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_moe.py:task=negative,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_moe.py         # all 6 runs

Arguments: task = brief (< 512 tokens) | negative; method = rp_only | additive | tag; runlocal
(a tiny 4-expert MoE). Otherwise the tag_math set-up (Big-Math hard split).
TPU slice: v5p-32 (16 chips, mesh tensor 4 x expert 4; run launch/check.py first).
launch/check.py (grouped-matmul stand-in, BUILD_NOTES "Pod check"): with model.moe_impl='ep'
(expert-parallel dispatch, exact) the policy step needs 249 GB per chip (280 with 'ragged') and
does NOT fit: per layer the fp32 attention scores [8 heads, 4,608, 4,608] and the 'ep' row buffers
dominate; no config field lowers them. The reference pass (74 GB with 'ep') fits.
Estimate: 162 v5p chip-hours for the default point (task=negative,method=tag, probes included);
whole table 758.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"task": ("brief", "negative"), "method": ("rp_only", "additive", "tag")}
DEFAULTS = {"task": "negative", "method": "tag"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_moe.py")
  c = tag_math.base_config("qwen3_30b_a3b", a["task"])
  c.model.moe_impl = "ep"                            # expert-parallel dispatch (exact; memory)
  cl.tag_method(c, a["method"], 2)
  return cl.runlocal(c, "qwen3_30b_a3b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_moe.py")
