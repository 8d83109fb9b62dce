r"""TAG Table 8: three channels (accuracy, brief, negative) trained jointly.

    python -m mr_rl.main --config=configs/tag_three_channels.py:model=qwen3_1_7b,method=tag \
        --workdir=$WORKDIR_ROOT/tag_three_channels/model-qwen3_1_7b/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_three_channels.py:model=qwen3_4b,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_three_channels.py  # all 8 runs

Arguments: model = qwen3_1_7b | qwen3_4b (Instruct-2507); method = rp_only (the reference for
"x of RP-only accuracy") | additive | rubric_dropout | tag (three probes, anchor elected among
three channels, lambda 1 on both auxiliaries); runlocal. Otherwise the tag_math set-up.
TPU slice: v5p-8.
Estimate: 79 v5p chip-hours for the default point (model=qwen3_1_7b,method=tag, three
probes); whole table 696.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"model": ("qwen3_1_7b", "qwen3_4b"),
           "method": ("rp_only", "additive", "rubric_dropout", "tag")}
DEFAULTS = {"model": "qwen3_1_7b", "method": "tag"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_three_channels.py")
  c = tag_math.base_config(a["model"], "brief")      # brief threshold of the model family ...
  c.rewards.channels = "accuracy,brief,negative"     # ... and both auxiliaries: RP, RA_1, RA_2
  cl.tag_method(c, a["method"], 3)
  return cl.runlocal(c, a["model"]) if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_three_channels.py")
