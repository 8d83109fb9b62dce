r"""AMRP Figures 2-3 (and appendix Figures 4-5): reward-profile and weight dynamics (paper 001).

    python -m mr_rl.main --config=configs/amrp_dynamics.py:setting=math,method=static \
        --workdir=$WORKDIR_ROOT/amrp_dynamics/setting-math/method-static
    launch/pod.sh $TPU $ZONE configs/amrp_dynamics.py:setting=math,method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/amrp_dynamics.py   # all 6 runs

Arguments: setting = math (Figs. 2-3: Qwen3-4B-Instruct, NuminaMath) | eli5 (Fig. 4:
Llama-3.1-8B-Instruct on ELI5) | align (Fig. 5: Qwen3-4B-Instruct, HelpSteer2 / ArmoRM);
method = static | amrp; runlocal.
Same set-ups as Tables 1-3 with a console line every step and checkpoints every 10 steps, so
curves can be cut at any point. Plot from WORKDIR/metrics.jsonl (written every step):
reward/<channel>/mean, reward/scalar/mean, weights/<channel> (AMRP w), the shortcut ratio
profile/accuracy=0,format=1,length=1 (Fig. 2b / 3c), response/length_mean (Fig. 2c / 3d).
TPU slice: v5p-8 (Qwen3-4B), v5p-16 (Llama-3.1-8B).
Estimate: 48 v5p chip-hours for the default point (setting=math,method=amrp); whole set
303.
"""

from mr_rl import config_lib as cl

amrp_math = cl.load_sibling(__file__, "amrp_math")  # Table 1's set-up (base_config)
amrp_alce = cl.load_sibling(__file__, "amrp_alce")  # Table 2's
amrp_align = cl.load_sibling(__file__, "amrp_align")  # Table 3's

CHOICES = {"setting": ("math", "eli5", "align"), "method": ("static", "amrp")}
DEFAULTS = {"setting": "math", "method": "amrp"}
MODELS = {"math": "qwen3_4b", "eli5": "llama3_1_8b_instruct", "align": "qwen3_4b"}


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/amrp_dynamics.py")
  model = MODELS[a["setting"]]
  if a["setting"] == "math":
    c = amrp_math.base_config(model)
  elif a["setting"] == "eli5":
    c = amrp_alce.base_config(model, "eli5")
  else:
    c = amrp_align.base_config(model)
  cl.amrp_method(c, a["method"])                     # static (equal weights) | amrp
  c.log_every = 1                                    # a console line every step
  c.checkpoint_every = 10                            # dense checkpoints along the curve
  return cl.runlocal(c, model) if a["runlocal"] else c


def sweep(arg=None):
  return cl.restrict(cl.grid(**CHOICES), arg, CHOICES, "configs/amrp_dynamics.py")
