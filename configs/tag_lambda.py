r"""TAG Table 9: the gate weight lambda from 0.25 to 4 on Qwen3-1.7B, correct & brief.

    python -m mr_rl.main --config=configs/tag_lambda.py:lam=2 \
        --workdir=$WORKDIR_ROOT/tag_lambda/lam-2
    launch/pod.sh $TPU $ZONE configs/tag_lambda.py:lam=4 $WORKDIR
    python -m mr_rl.config_lib list configs/tag_lambda.py      # all 5 runs

Arguments: lam = 0.25 | 0.5 | 1 | 2 | 4; runlocal. Pipeline 'tag' (probe, elect, train) with
anchor.lam = lambda. The election does not depend on lambda: copying WORKDIR/drift.json of one
run into the others' work directories before they start skips their probes.
TPU slice: v5p-8.
Estimate: 74 v5p chip-hours for the default point (lam=2, probes included); whole table
369 (less when drift.json is reused).
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # Table 1's set-up (base_config)

CHOICES = {"lam": ("0.25", "0.5", "1", "2", "4")}
DEFAULTS = {"lam": "2"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_lambda.py")
  c = tag_math.base_config("qwen3_1_7b", "brief")
  cl.tag_method(c, "tag", 2, lam=float(a["lam"]))
  return cl.runlocal(c, "qwen3_1_7b") if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/tag_lambda.py")
