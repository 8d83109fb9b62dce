r"""TAG Table 1 (and Sec. C.3): math with a compatible (brief) or incompatible (negative) auxiliary.

    python -m mr_rl.main --config=configs/tag_math.py:model=qwen3_1_7b,task=negative,method=tag \
        --workdir=$WORKDIR_ROOT/tag_math/model-qwen3_1_7b/task-negative/method-tag
    launch/pod.sh $TPU $ZONE configs/tag_math.py:model=qwen3_4b,task=brief,method=additive $WORKDIR
    python -m mr_rl.config_lib list configs/tag_math.py        # all 102 runs

Arguments: model = qwen3_1_7b | qwen3_4b (Instruct-2507) | llama3_2_3b | llama3_1_8b;
task = brief (accuracy + length < 200 Qwen / 128 Llama tokens) | negative (accuracy + final
answer < 0); method = rp_only | additive ((RP+RA)/2) | weighted (0.9 RP + 0.1 RA) | min |
lagrangian | pg_ot | mo_grpo | dr_grpo | rubric_dropout | lsc | additive_kl (beta 0.1) | tag
(pipeline 'tag': probe each channel 300 steps, elect the anchor by per-token reverse KL, train
TAG from pi_0); subset = auto (Qwen: Big-Math hard; Llama: Llama-calibrated) | hard |
llama_calibrated; lora = 0 (full fine-tuning, the papers') | 8 | 16 | 32 | 64 (LoRA of that
rank on every attention and MLP kernel, alpha = 2 x rank, lr x 10: not a paper setting; the
sweep keeps lora=0); runlocal.
The sweep is the 4 x 2 x 12 grid plus Sec. C.3's control (Llama-3.2-3B on the hard split:
rp_only, additive, tag on both tasks). GRPO 500 steps x 256 rollouts, lr 1e-6, clip 0.2/0.28,
completions up to 4,096 tokens; eval: 4 samples on each test problem (pass@1 / pass@4).
Values the summary leaves open (project choices, docs/methods.md §1-2): Lagrangian threshold 0.5
and dual lr 0.1, LSC tau 0.1, Rubric Dropout p 0.5, Additive+KL beta 0.1 (k3), TAG lambda 1.
`base_config` is also the set-up of Tables 7-10 and Figure 6 (tag_kl_sweep, tag_three_channels,
tag_lambda, tag_moe, tag_downweight) and of the math rows of Table 4 (tag_drift).
TPU slice: v5p-8 (1.7B, 4B, 3B), v5p-16 (Llama-3.1-8B, with a bfloat16 KV cache in the sampler so
it fits: 75 of 95 GB per chip, launch/check.py; old log-probs then come from the fp32 training
forward, `optim.loss.recompute_old_logp` auto).
Estimate: 74 v5p chip-hours for the default point (model=qwen3_1_7b,task=negative,method=tag,
probes included); whole table 9302.
"""

from mr_rl import config_lib as cl

CHOICES = {"model": ("qwen3_1_7b", "qwen3_4b", "llama3_2_3b", "llama3_1_8b"),
           "task": ("brief", "negative"), "method": cl.TAG_METHODS,
           "subset": ("auto", "hard", "llama_calibrated"), "lora": cl.LORA_RANKS}
DEFAULTS = {"model": "qwen3_1_7b", "task": "negative", "method": "tag", "subset": "auto",
            "lora": "0"}

CHANNELS = {"brief": "accuracy,brief", "negative": "accuracy,negative"}  # RP first, then RA
BRIEF_THRESHOLD = {"qwen3": 200, "llama": 128, "qwen3_moe": 512}  # tokens, per model family


# optim.num_micro_batches per model on its slice, chosen by launch/check.py --fit.
FITTED_MICRO_BATCHES = {"qwen3_1_7b": 32, "qwen3_4b": 128, "llama3_2_3b": 64,
                        "llama3_1_8b": 64}


def base_config(model: str, task: str, subset: str = "auto"):
  """Big-Math with auxiliary `task` on paper model `model` (a config_lib.MODELS key), no method.

  `subset` auto: Big-Math hard for Qwen, the Llama-calibrated band for Llama.
  """
  family = cl.MODELS[model].family
  if subset == "auto":
    subset = "llama_calibrated" if family == "llama" else "hard"
  c = cl.paper_base()   # GRPO of both papers: 500 steps, B 32 x G 8, lr 1e-6, clip 0.2 / 0.28
  cl.set_model(c, model)                             # hub id, fp32 master / bf16 compute and
                                                     # KV cache, tensor-parallel mesh
  # Training data and prompts
  c.data.name = f"big_math_{subset}"                 # Big-Math-RL-Verified band (project cut)
  c.data.template = "tag_math"                       # "... final answer within \boxed{}"
  c.data.max_prompt_len = 512                        # problem + instruction
  c.rollout.max_new_tokens = 4096                    # 4,096 (stated for Qwen3-30B; used for all)
  # Micro-batches by `launch/check.py --topology=SLICE --fit` (XLA:TPU, 2026-12-06): Qwen3-1.7B
  # takes 8 rows per micro-batch at T = 4,608 on v5p-8 (policy step 90.3 GB, 12% of HBM free;
  # 16 rows do not compile). Models not listed keep config_lib.MODELS' one row per group.
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES.get(model, c.optim.num_micro_batches)
  # Rewards
  c.rewards.channels = CHANNELS[task]                # RP = accuracy, RA = brief | negative
  if task == "brief":
    c.rewards.params = dict(brief=dict(threshold=BRIEF_THRESHOLD[family]))  # < 200/128/512 tok.
  # Final evaluation: the test split (data.eval_split "test")
  c.eval.num_prompts = 1500                          # the whole test split (1,498 / 1,500)
  c.eval.samples_per_prompt = 4                      # 4 samples: pass@4 and pass@1
  cl.tag_probes(c)                                   # TAG: 300-step probes, drift on 256 prompts
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/tag_math.py")
  c = base_config(a["model"], a["task"], a["subset"])
  cl.tag_method(c, a["method"], 2)
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, a["model"]) if a["runlocal"] else c


def sweep(arg=None):
  main = cl.grid(model=CHOICES["model"][:4], task=CHOICES["task"], method=CHOICES["method"])
  control = cl.grid(model=("llama3_2_3b",), task=CHOICES["task"],
                    method=("rp_only", "additive", "tag"), subset=("hard",))
  return cl.restrict(main + control, arg, CHOICES, "configs/tag_math.py")
