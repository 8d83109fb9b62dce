r"""Multi-turn math with a Python tool (issue 42): Qwen3-4B-Instruct-2507 calls a sandboxed
interpreter in Hermes `<tool_call>`s; TAG or AMRP composes the trajectory's channels.

    python -m mr_rl.main --config=configs/math_tools.py:method=tag \
        --workdir=$WORKDIR_ROOT/math_tools/method-tag
    launch/pod.sh $TPU $ZONE configs/math_tools.py:method=amrp $WORKDIR
    python -m mr_rl.config_lib list configs/math_tools.py        # all 3 runs
    python launch/check.py --config=configs/math_tools.py --topology=v5p-8   # the turn programs

Not a paper table: the multi-turn pod config (docs/multiturn.md). Big-Math hard and the
tag_math set-up (GRPO B 32 x G 8, lr 1e-6, clip 0.2/0.28, 500 steps; the `\boxed{}` request on
the user turn) with the built-in `python` tool (`multiturn.tools`: the reward sandbox, 5 s,
<= 200 characters out), the tool's schema in Qwen3's system block, up to 4 policy turns, 3,072
response columns for every turn and observation (observations cut to 128 ids). Channels
[accuracy, tool_success, brief]: accuracy of what the policy wrote (a text channel: the tool's
output is never read as the answer; primary), tool_success (an environment channel: the share
of its calls that ran), brief (fewer than 512 tokens written by the policy over its turns).
Arguments: method = tag (pipeline 'tag': a single-channel probe per channel, anchor elected by
reverse KL, lambda 1) | amrp (AMRP's paper values) | additive (static equal weights); lora;
runlocal (the tiny Qwen3 checkpoint and its ChatML template, one multi-turn step on CPU).
Template: Qwen3-4B-Instruct-2507's own is append-only for tool observations (a 'tool' message
renders as `<|im_start|>user\n<tool_response>...`, earlier turns unchanged; it has no
`<think>` handling), so observations are exact template deltas. The hybrid-thinking Qwen3
template (Qwen3-1.7B) is refused (`render.NotAppendOnly`: docs/multiturn.md), hence one model.
TPU slice: v5p-8 (`launch/check.py --topology=v5p-8 --fit`: 4 rows per micro-batch, 256 slots).
Estimate: 103 v5p chip-hours for the default point (method=tag, three probes); whole table 261.
The estimate counts tokens only: waits for tools are not in it.
"""

from mr_rl import config_lib as cl

tag_math = cl.load_sibling(__file__, "tag_math")  # TAG Table 1's set-up (base_config)

CHOICES = {"method": ("tag", "amrp", "additive"), "lora": cl.LORA_RANKS}
DEFAULTS = {"method": "tag", "lora": "0"}
MODEL = "qwen3_4b"
# On v5p-8 by `launch/check.py --topology=v5p-8 --fit --slots=256` (XLA:TPU, 2026-12-06), T =
# 1,024 + 3,072: 4 rows per micro-batch (policy step 91.4 GB per chip, 11% of HBM free; 8 rows
# do not compile) and a slot for each of the 256 trajectories (the turn programs' largest,
# `engine_append`, 76.6 GB, 25% free): docs/benchmarks.md, "Paper configs on a pod".
FITTED_MICRO_BATCHES = 64
FITTED_SLOTS = 256


def base_config():
  """The multi-turn set-up on Qwen3-4B-Instruct-2507, before the method."""
  c = tag_math.base_config(MODEL, "brief")           # Big-Math hard, \boxed{} request, eval
  c.data.max_prompt_len = 1024                       # problem + request + the tools' system block
  c.rollout.max_new_tokens = 3072                    # every turn and observation of a trajectory
  c.optim.num_micro_batches = FITTED_MICRO_BATCHES   # launch/check.py --fit (XLA:TPU, v5p-8)
  c.rollout.slots = FITTED_SLOTS                     # one slot per trajectory across its turns
  # The tools: the built-in sandboxed interpreter, called in Qwen3's Hermes format.
  c.multiturn.tools = "mr_rl.multiturn.builtin_tools:python"
  c.multiturn.tool_format = "hermes"                 # <tool_call>{"name": ..., "arguments": ...}
  c.multiturn.max_turns = 4                          # policy turns per trajectory
  c.multiturn.max_observation_tokens = 128           # 200 characters + the template's markup
  c.multiturn.step_timeout_s = 30.0                  # the sandbox's 5 s run + its start-up
  c.multiturn.workers = 16                           # host threads (each tool call a sandbox)
  # Rewards: the policy's answer (primary), its calls that ran, and brevity of what it wrote.
  c.rewards.channels = "accuracy,tool_success,brief"
  c.rewards.params = dict(brief=dict(threshold=512))  # tokens the policy wrote, all turns
  return c


def get_config(arg=None):
  a = cl.parse_arg(arg, CHOICES, DEFAULTS, "configs/math_tools.py")
  c = base_config()
  if a["method"] == "amrp":
    cl.amrp_method(c, "amrp")                        # AMRP's paper hyperparameters
  else:
    cl.tag_method(c, a["method"], 3)                 # tag: probes, election, gate; or additive
  cl.set_lora(c, int(a["lora"]))                     # LoRA RL (lora > 0): adapters only
  return cl.runlocal(c, MODEL) if a["runlocal"] else c


def sweep(arg=None):
  swept = {k: v for k, v in CHOICES.items() if k != "lora"}  # the sweep keeps lora=0
  return cl.restrict(cl.grid(**swept), arg, CHOICES, "configs/math_tools.py")
