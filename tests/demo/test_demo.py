"""The embedded CPU demo: its task and rewards (attacks included), the base-policy recipe, the
method names, the targets and the multi-seed summary on synthetic reports, and the smoke
variant (`configs/demo.py:smoke`) end to end through `mr_rl.main`'s pipeline."""

import pathlib
import json
import os

import numpy as np
import pytest

from mr_rl import pipelines
from mr_rl.demo import run, styles, summary, task, warmstart

REPO = str(pathlib.Path(__file__).resolve().parents[2])


def _demo_config(arg):
  import importlib.util
  spec = importlib.util.spec_from_file_location("demo_cfg", os.path.join(REPO, "configs", "demo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config(arg)


# ---------------------------------------------------------------------------------- task
def _tok_len(tok, text):
  return len(tok(text, add_special_tokens=False)["input_ids"]) + 1  # + <eos>


def test_solution_styles_and_their_lengths():
  p = task.Problem((7, 5, 9, 3), ("+", "-", "+"))
  assert p.answer == 6
  assert p.solution() == "<r>7+5=12;12-9=3;3+3=6</r><a>6</a>"
  assert p.solution("verbose") == "<r>7+5=12;7+5=12;12-9=3;12-9=3;3+3=6;3+3=6</r><a>6</a>"
  assert p.solution("direct") == "<r></r><a>6</a>"
  assert p.solution(answer=-6, broken_format=True) == "<r>7+5=12;12-9=3;3+3=6</r>=-6"
  with pytest.raises(ValueError, match="unknown solution style 'chatty'"):
    p.solution("chatty")
  loop = p.solution("loop", loop_step=1)
  assert loop.startswith("<r>7+5=12;12-9=3;12-9=3;12-9=3") and "</r>" not in loop
  with pytest.raises(ValueError, match="loop_step must be in"):
    p.solution("loop", loop_step=3)
  assert p.solution("chained") == "<r>7+5=12-9=3+3=6</r><a>6</a>"
  assert p.solution("restated", broken_format=True) == "<r>7+5-9+3;7+5=12;12-9=3;3+3=6</r>=6"
  assert task.Problem((4, 2), ("-",)).solution("chained") == task.Problem((4, 2), ("-",)).solution()
  # The regime of the demo (configs/demo.py: cap 48, length rule full to 32, brief < 23, brief
  # on 4-6 terms, acc_fmt_len on 6-7): on brief's problems the base's long style (restated,
  # steps on 6 terms) is never brief and fits the cap; the chained answer is 0.6-0.75x as long
  # (the room TAG can cut without losing accuracy), brief on 3 terms always, on 4 mostly and on
  # 5-6 (almost) never (where only the direct guess is brief, so additive pays a wrong guess as
  # much as a correct answer); direct answers are always brief; 7-term steps are over the
  # cap mostly; a loop always overshoots the cap.
  tok, rng = task.make_tokenizer(), np.random.default_rng(0)
  by_k = {}
  for q in task.sample_problems(rng, 3000, max_terms=7):
    by_k.setdefault(len(q.terms), []).append(q)
  cfg = _demo_config(None)
  cap, full, brief = (cfg.rollout.max_new_tokens, cfg.demo.len_full_until,
                      cfg.demo.brief_threshold)
  lo, hi = cfg.demo.problems_for.brief.min_terms, cfg.demo.problems_for.brief.max_terms
  assert (lo, hi) == (4, 6) and warmstart.RECIPE.restate_max_terms == hi - 1
  styles_ = ("concise", "restated", "chained", "direct")
  lens = {(k, s): np.array([_tok_len(tok, q.solution(s)) for q in qs])
          for k, qs in by_k.items() for s in styles_}
  for k in range(lo, hi + 1):  # the base's long style: restated up to 5 terms, steps beyond
    long_ = lens[k, "restated" if k <= warmstart.RECIPE.restate_max_terms else "concise"]
    assert long_.min() >= brief and np.mean(long_ > cap) < 0.05
    assert lens[k, "chained"].mean() <= 0.75 * long_.mean()
  assert lens[3, "chained"].max() < brief
  assert 0.6 < np.mean(lens[4, "chained"] < brief) < 0.85
  assert np.mean(lens[5, "chained"] < brief) < 0.02 and lens[6, "chained"].min() >= brief
  assert all(lens[k, "direct"].max() < brief for k in by_k)
  assert np.mean(lens[6, "restated"] > cap) > 0.9  # why the base restates only up to 5 terms
  assert np.mean(lens[7, "concise"] > cap) > 0.5
  # acc_fmt_len (6-7 terms) and its length rule (full to 32, 0 at 40): a correct chained
  # answer can earn full length credit (mostly on 6 terms, sometimes on 7, else partial
  # credit); the base's long correct reasoning (steps on 6-7 terms) mostly earns none, so
  # under static weights reasoning pays less than the shortcut; 5-term chained answers, all
  # at full credit, would be static's way out (docs/demo.md "Design").
  zero = cfg.demo.len_zero_at
  assert (full, zero) == (32, 40)
  assert lens[5, "chained"].max() <= full
  assert 0.6 < np.mean(lens[6, "chained"] <= full) < 0.9
  assert 0 < np.mean(lens[7, "chained"] <= full) < 0.2 and lens[7, "chained"].mean() < zero
  assert lens[5, "restated"].min() > full and np.mean(lens[5, "restated"] >= zero) > 0.85
  assert np.mean(lens[6, "concise"] > full) > 0.95 and np.mean(lens[6, "concise"] >= zero) > 0.6
  assert np.mean(lens[7, "concise"] >= zero) > 0.95
  assert min(_tok_len(tok, q.solution("loop", loop_step=0)) for q in by_k[4]) > cap


def test_response_style_names_every_solution_style():
  for q in task.sample_problems(np.random.default_rng(1), 200, max_terms=7):
    for style in ("concise", "restated", "chained", "direct"):
      for broken in (False, True):
        want = "concise" if style == "chained" and len(q.terms) == 2 else style
        assert styles.response_style(q.solution(style, broken_format=broken)) == want
    if len(q.terms) > 2:  # on 2 terms 'verbose' is one step written twice
      assert styles.response_style(q.solution("verbose")) == "verbose"
    assert styles.response_style(q.solution("loop", loop_step=0)) == "runaway"
  assert styles.response_style("<r>7+5=12;12</r><a>12</a>") == "other"
  assert styles.response_style("12</r><a>12</a>") == "other"


def test_style_table_of_the_shipped_base_policy():
  """Shares per chain length sum to 1; accuracies and lengths are in range."""
  cfg = _demo_config("smoke")
  table = styles.style_table(cfg.model.path, min_terms=3, max_terms=4, samples=64)
  assert set(table) == {3, 4}
  for row in table.values():
    assert sum(share for share, _, _ in row.values()) == pytest.approx(1.0)
    assert all(0 <= acc <= 1 and 1 <= n <= 48 for _, acc, n in row.values())
  assert table[3]["direct"][2] < 10  # `<r></r><a>N</a>` + EOS: 6-8 tokens


@pytest.mark.parametrize("response, answer", [
    ("<r>7+5=12</r><a>12</a>", 12),
    ("<r>7+5=12</r>=12", 12),          # broken format: still an answer
    ("<r></r> = -4 ", -4),
    ("<r>1</r><a>2</a><a>3</a>", 3),   # the last block counts
    ("<r>7+5=12;12-9=3;3+3", None),    # cut off by the cap: the last total is no answer
    ("12", None),                       # a bare number is no answer
    ("<r></r><a>x</a>", None),
    ("<r></r>=3=4", None),
])
def test_extract_answer(response, answer):
  assert task.extract_answer(response) == answer


def test_extract_answer_is_the_old_regex_and_linear():
  """Attack (issue 41, 4): `re.findall(r"<a>(.*?)</a>")` scanned to the end from every unclosed
  `<a>`: quadratic on a thread channel. The honest control: the last block, as before."""
  import random, re, time  # pylint: disable=g-import-not-at-top,multiple-imports
  old = re.compile(r"<a>(.*?)</a>", re.S)
  rng = random.Random(0)
  alphabet = ["<a>", "</a>", "<", "a", ">", "/", "5", "-", " ", "</r>", "="]
  for _ in range(20000):
    text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(20)))
    blocks = old.findall(text)
    assert task._last_answer_block(text) == (blocks[-1] if blocks else None), text  # pylint: disable=protected-access
  t0 = time.perf_counter()
  assert task.extract_answer("<r>1+2</r><a>3</a>" + "<a>" * 20_000) == 3
  assert time.perf_counter() - t0 < 0.1


def test_rewards_resist_the_obvious_attacks():
  # A truncated (runaway) response whose last running total happens to be the answer scores
  # nothing on any channel but `brief`-by-length; a format wrapper around a second answer
  # block is not format-compliant.
  runaway = "<r>7+5=12;7+5=12;12-9=3;12-9=3;3+3=6;3+3=6;6"
  assert task.accuracy(runaway, 6) == 0.0 and task.negative(runaway) == 0.0
  assert task.fmt(runaway) == 0.0
  assert task.fmt("<r>7+5=12</r><a>12</a>") == 1.0
  assert task.fmt(" <r></r> <a>-3</a> ") == 1.0
  assert task.fmt("<r>7+5=12</r>=12") == 0.0
  assert task.fmt("<r>1</r><a>2</a><a>3</a>") == 0.0  # two answers: not the format
  assert task.fmt("<r><a>1</a></r><a>1</a>") == 0.0   # a tag inside a block
  assert task.negative("<r></r><a>-1</a>") == 1.0 and task.negative("<r></r><a>0</a>") == 0.0
  assert task.soft_length(40, 40, 48) == 1.0 and task.soft_length(44, 40, 48) == 0.5
  assert task.soft_length(48, 40, 48) == 0.0


# ----------------------------------------------------------------------------- warm start
def test_warmstart_targets_follow_the_mixture():
  cfg = warmstart.WarmStartConfig(p_direct=0.3, p_chained=0.3, restate_max_terms=2,
                                  p_verbose=0.8, verbose_max_terms=3, p_loop=0.3,
                                  loop_min_terms=4, p_broken_format=0.6, p_sign_slip=0.12)
  rng = np.random.default_rng(0)
  probs = task.sample_problems(rng, 8000, max_terms=7)
  texts = [warmstart.target_text(p, rng, cfg) for p in probs]
  k = np.array([len(p.terms) for p in probs])
  direct = np.array([t.startswith("<r></r>") for t in texts])
  loop = np.array(["</r>" not in t for t in texts])
  reasoning = [t.split("</r>")[0] for t in texts]
  verbose = np.array([not d and not lp and r.count(";") == 2 * len(p.terms) - 3
                      for p, r, d, lp in zip(probs, reasoning, direct, loop)])
  style = np.array([styles.response_style(t) for t in texts])
  chained = (style == "chained") | ((k == 2) & (style == "concise"))
  restated = style == "restated"
  broken = np.array(["<a>" not in t and "</r>" in t for t in texts])
  slips = np.mean([task.extract_answer(t) == -p.answer for p, t, d, lp in
                   zip(probs, texts, direct, loop) if p.answer != 0 and not lp])
  reasoned = ~direct & ~loop
  assert abs(direct.mean() - 0.3) < 0.03
  # Chained reasoning at every chain length, the same share on short and long chains; the
  # rest restated up to restate_max_terms (2 here), then plain steps, verbose up to 3 terms.
  for ks in ((3,), (4, 5), (6, 7)):
    assert abs(chained[reasoned & np.isin(k, ks)].mean() - 0.3) < 0.04, ks
  assert abs(restated[reasoned & (k == 2)].mean() - 0.7) < 0.04 and not restated[k > 2].any()
  assert abs(verbose[(k == 3) & reasoned].mean() - 0.7 * 0.8) < 0.05 and not verbose[k > 3].any()
  assert abs(loop[(k >= 4) & ~direct].mean() - 0.3) < 0.04 and not loop[k < 4].any()
  assert abs(broken[reasoned].mean() - 0.6) < 0.03 and not broken[direct].any()
  assert abs(slips - 0.12) < 0.02
  # The chained targets are the chained solution of their problem (answer, format as drawn).
  for p, t, ch in zip(probs[:400], texts, chained):
    if ch:
      assert t in {p.solution("chained", answer=a, broken_format=b)
                   for a in (p.answer, -p.answer) for b in (False, True)}, t
  # A runaway target is cut to RESPONSE_LEN tokens without <eos>; others end with <eos>.
  tok = task.make_tokenizer()
  long_p = task.Problem((9,) * 7, ("+",) * 6)
  _, _, r_tok, r_mask = warmstart.encode_batch(
      tok, [long_p.prompt] * 2, [long_p.solution("verbose"), long_p.solution("direct")])
  assert r_mask[0].sum() == warmstart.RESPONSE_LEN and tok.eos_token_id not in r_tok[0]
  assert r_tok[1][r_mask[1].sum() - 1] == tok.eos_token_id


def test_shipped_base_policy_is_the_documented_recipe():
  """The asset is a loadable HF checkpoint made by `warmstart.RECIPE` (the command in
  docs/demo.md), so it can be regenerated."""
  cfg = _demo_config("smoke")
  from transformers import AutoConfig, AutoTokenizer
  hf = AutoConfig.from_pretrained(cfg.model.path)
  assert hf.model_type == "qwen3" and hf.max_position_embeddings == warmstart.MAX_SEQ_LEN
  tok = AutoTokenizer.from_pretrained(cfg.model.path)
  p = task.sample_problems(np.random.default_rng(0), 1)[0]
  ids = tok(p.prompt + p.solution(), add_special_tokens=False)["input_ids"]
  assert tok.decode(ids) == p.prompt + p.solution()
  with open(os.path.join(cfg.model.path, "warmstart.json")) as f:
    made = json.load(f)
  made.pop("final_loss")
  recipe = dataclasses_asdict(warmstart.RECIPE)
  assert made == {k: v for k, v in recipe.items() if k in made}
  # Fields added after the asset was made, at values that change nothing for it.
  assert {k: recipe[k] for k in set(recipe) - set(made)} == {
      "calculator": False, "p_tool": 0.0, "init_from": ""}
  size = sum(os.path.getsize(os.path.join(cfg.model.path, f)) for f in os.listdir(cfg.model.path))
  assert size < 5e6


def dataclasses_asdict(x):
  import dataclasses
  return dataclasses.asdict(x)


# ------------------------------------------------------------------------------- methods
def test_method_names():
  pm = run.parse_method
  assert pm("rp_only") == run.Method("rp_only", "rp_only")
  assert pm("weighted_0.3").aux_weight == 0.3
  assert pm("amrp_gdpo").advantage == "gdpo" and pm("additive_ppo").advantage == "ppo"
  assert pm("additive_kl0.01").kl_coef == 0.01 and pm("additive_kl1").kl_coef == 1.0
  assert run.method_aggregator("weighted_0.3", 3) == ("weighted", {"w": [0.7, 0.15, 0.15]})
  assert run.method_aggregator("weighted", 2) == ("weighted", {"w": [0.9, 0.1]})
  assert run.method_aggregator("dropout", 3) == ("rubric_dropout", {})
  for bad, msg in (("sgd", "unknown demo method 'sgd'"), ("amrp_adam", "unknown modifier 'adam'"),
                   ("weighted_1.5", r"must be in \(0, 1\)"), ("tag_gdpo", "tag takes no"),
                   ("additive_gdpo_ppo", "more than one advantage"),
                   ("additive_klx", "bad KL coefficient")):
    with pytest.raises(ValueError, match=msg):
      pm(bad)


def test_demo_configs_resolve():
  from mr_rl import settings as settings_lib
  default, full = _demo_config(None), _demo_config("full")
  assert default.demo.tasks == "brief,negative,acc_fmt_len"
  assert set(default.demo.methods_for) == set(default.demo.tasks.split(","))
  assert set(full.demo.methods_for) == set(full.demo.tasks.split(","))
  # Every default target's methods run, and TAG (the anchor election) in every task.
  need = {"brief": {"rp_only", "additive", "tag"}, "negative": {"rp_only", "additive", "tag"},
          "acc_fmt_len": {"additive", "amrp", "tag"}}
  for cfg in (default, full):
    for t, methods in need.items():
      assert methods <= set(run.task_methods(cfg.demo, t)), t
  for cfg in (default, full, _demo_config("seed=2")):
    settings_lib.from_config(cfg)
    for t in cfg.demo.tasks.split(","):
      assert run.task_methods(cfg.demo, t)
  assert _demo_config("seed=2").data.options.seed == 2
  assert "amrp_ppo" in run.task_methods(full.demo, "acc_fmt_len")
  assert run.task_methods(full.demo, "brief_negative") == ["rp_only", "additive", "dropout",
                                                           "tag"]
  with pytest.raises(ValueError, match="unknown arguments"):
    _demo_config("smoke,fast")
  with pytest.raises(ValueError, match="exclude each other"):
    _demo_config("smoke,full")
  pilot = _demo_config("seed=10,tasks=brief+acc_fmt_len")
  assert pilot.demo.tasks == "brief,acc_fmt_len" and set(pilot.demo.methods_for) == {
      "brief", "acc_fmt_len"}
  assert run.task_methods(pilot.demo, "brief") == run.task_methods(default.demo, "brief")
  assert set(_demo_config("full,tasks=brief_negative").demo.methods_for) == {"brief_negative"}
  with pytest.raises(ValueError, match=r"tasks='brief\+nope' names \['nope'\]"):
    _demo_config("tasks=brief+nope")
  with pytest.raises(ValueError, match="names no task"):
    _demo_config("tasks=")


def test_tasks_draw_their_own_problems():
  from mr_rl import settings as settings_lib
  cfg = _demo_config(None)
  base = settings_lib.from_config(cfg)
  neg = run.task_settings(base, cfg.demo, "negative")
  brief = run.task_settings(base, cfg.demo, "brief")
  afl = run.task_settings(base, cfg.demo, "acc_fmt_len")
  assert neg.data.options["min_terms"] == 4 and neg.data.options["max_terms"] == 7
  assert (brief.data.options["min_terms"], brief.data.options["max_terms"]) == (4, 6)
  assert (afl.data.options["min_terms"], afl.data.options["max_terms"]) == (6, 7)
  assert brief.data.options["seed"] == 0
  assert neg.rewards.channels == ("arith_acc", "arith_negative")
  assert brief.rewards.params == {"arith_brief": {"threshold": cfg.demo.brief_threshold}}
  cfg.demo.problems_for.negative.num_train = 5
  with pytest.raises(ValueError, match=r"problems_for.negative: unknown option\(s\) \['num_train'\]"):
    run.task_settings(base, cfg.demo, "negative")


# ------------------------------------------------------------------------------- targets
def _trace(profiles, weights=None, negative=None):
  n = len(next(iter(profiles.values())))
  tr = {"step": list(range(n)), "profiles": profiles, "reward": {}, "length": [20.0] * n}
  if negative is not None:
    tr["reward"]["negative"] = negative
  if weights:
    tr["weights"] = weights
  return tr


def _report(seed, rp=0.6, base=0.4, add_neg_acc=0.2, add_neg=0.9, tag=0.58, tag_brief=0.58,
            add_brief=0.3,
            tag_joint=0.4, rp_joint=0.3, amrp=0.5, static=0.4, static_shortcut=0.6,
            amrp_full=0.5, static_full=0.3, anchor="arith_acc", tag_len=14.0):
  row = lambda acc, aux=0.5, joint=0.3, length=20.0: {"accuracy": acc, "aux_rate": aux,
                                                      "joint_rate": joint, "mean_length": length}
  short_prof = lambda shortcut, full: {
      summary.SHORTCUT: [0.2, shortcut, 0.3, 0.3, 0.3, 0.3, 0.3],
      summary.FULL_PROFILE: [0.3, 0.2, full, full, full, full, full],
      "acc=1,fmt=0,len=1": [0.5, 0.2, 0.1, 0.1, 0.1, 0.1, 0.1]}
  tag_row = lambda acc, joint=0.3, length=20.0: dict(row(acc, joint=joint, length=length),
                                                     anchor=anchor)
  return {
      "negative": {"base": row(base), "rp_only": row(rp), "additive": row(add_neg_acc, add_neg),
                   "tag": tag_row(tag)},
      "brief": {"base": row(base), "rp_only": row(rp, joint=rp_joint),
                "additive": row(add_brief), "tag": tag_row(tag_brief, tag_joint, tag_len)},
      "acc_fmt_len": {
          "base": row(base), "rp_only": row(rp), "tag": tag_row(0.58),
          "additive": dict(row(static), trace=_trace(short_prof(static_shortcut, static_full))),
          "amrp": dict(row(amrp), trace=_trace(short_prof(0.25, amrp_full),
                                               weights={"acc": [1.0] * 7}))},
      "_meta": {"seed": seed, "seconds": 100.0}}


def test_every_target_passes_and_fails_on_synthetic_reports():
  good = {r["target"]: r for r in summary.target_rows(_report(0))}
  assert [r["target"] for r in summary.target_rows(_report(0))] == [n for n, _ in summary.TARGETS]
  assert all(r["passed"] is True for r in good.values()), [
      n for n, r in good.items() if not r["passed"]]
  assert good["negative: additive accuracy <= 0.5x RP-only"]["value"] == pytest.approx(1 / 3)
  assert good["brief: TAG correct&brief - RP-only's >= +0.05"]["value"] == pytest.approx(0.1)
  assert good["brief: TAG mean length <= 0.75x RP-only"]["value"] == pytest.approx(0.7)
  assert "first at step 1" in good[
      "acc_fmt_len: static rollouts' most common profile is (0,1,1) at some step"]["text"]
  # Each target fails on its own violation (the others keep passing).
  cases = {
      "negative: additive negative rate >= 0.8": dict(add_neg=0.79),
      "negative: additive accuracy <= 0.5x RP-only": dict(add_neg_acc=0.31),
      "negative: TAG accuracy >= 0.9x RP-only": dict(tag=0.53),
      "brief: TAG accuracy >= 0.95x RP-only": dict(tag_brief=0.56),
      "brief: TAG mean length <= 0.75x RP-only": dict(tag_len=15.5),
      "brief: additive accuracy <= 0.6x RP-only": dict(add_brief=0.37),
      "brief: TAG correct&brief - RP-only's >= +0.05": dict(tag_joint=0.34),
      "acc_fmt_len: static rollouts' most common profile is (0,1,1) at some step":
          dict(static_shortcut=0.2),   # ties with another profile: not the mode
      "acc_fmt_len: AMRP accuracy - static >= +0.05": dict(amrp=0.44),
      "acc_fmt_len: AMRP final (1,1,1) rollout share > static's": dict(amrp_full=0.3),
      "RP-only accuracy - base > 0 in every task": dict(base=0.6),
  }
  for name, kw in cases.items():
    rows = {r["target"]: r for r in summary.target_rows(_report(0, **kw))}
    assert rows[name]["passed"] is False, name
    assert sum(r["passed"] is False for r in rows.values()) == 1, (name, [
        n for n, r in rows.items() if r["passed"] is False])
  one_task = _report(0)
  one_task["negative"]["base"]["accuracy"] = 0.65  # RP-only (0.6) got worse on one task only
  rows = {r["target"]: r for r in summary.target_rows(one_task)}
  rp_row = rows["RP-only accuracy - base > 0 in every task"]
  assert rp_row["passed"] is False and rp_row["value"] == pytest.approx(-0.05)
  assert "negative -0.050" in rp_row["text"] and "brief +0.200" in rp_row["text"]
  rows = {r["target"]: r for r in summary.target_rows(_report(0, anchor="arith_brief"))}
  assert rows["brief: TAG elects arith_acc"]["passed"] is False
  assert rows["brief: TAG elects arith_acc"]["text"] == "arith_brief"
  # A missing task or method is n/a, never a pass.
  partial = {"negative": {"rp_only": {"accuracy": 0.5}}, "_meta": {"seed": 0}}
  assert all(r["passed"] is None for r in summary.target_rows(partial))


def test_full_checks_on_a_synthetic_full_report():
  rep = _report(0)
  row = lambda acc, neg=0.1, brief=0.5: {"accuracy": acc, "aux_rate": neg,
                                         "rate/arith_negative": neg, "rate/arith_brief": brief}
  rep["acc_fmt_len"].update({"additive_gdpo": row(0.4), "amrp_gdpo": row(0.5),
                             "additive_ppo": row(0.4), "amrp_ppo": row(0.42)})
  rep["negative"]["base"]["aux_rate"] = 0.15
  rep["negative"].update({
      "additive_kl0.01": row(0.1, 0.9), "additive_kl1": row(0.42, 0.17),
      **{f"weighted_{w}": dict(row(0.3, 0.6), trace=_trace(
          {"acc=0,negative=1": [0.1] * 4}, negative=neg))
         for w, neg in (("0.5", [0.2, 0.6, 0.9, 0.9]), ("0.3", [0.2, 0.3, 0.6, 0.9]),
                        ("0.1", [0.2, 0.2, 0.3, 0.4]))}})
  rep["brief_negative"] = {"rp_only": row(0.6, 0.1, 0.4), "additive": row(0.02, 0.95, 0.99),
                           "dropout": row(0.03, 0.9, 0.7),
                           "tag": dict(row(0.55, 0.12, 0.6), anchor="arith_acc")}
  rows = {r["target"]: r for r in summary.target_rows(rep)}
  expect = {
      "acc_fmt_len: AMRP+GDPO accuracy - static GDPO >= +0.05": True,
      "acc_fmt_len: AMRP+PPO accuracy - static PPO >= +0.05": False,
      "negative: Additive+KL beta 0.01 negative rate >= 0.8": True,
      "negative: Additive+KL beta 1 stalls (within 0.05 of base)": True,
      "brief_negative: additive takes both shortcuts (rates >= 0.8)": True,
      "brief_negative: Rubric Dropout takes both shortcuts (rates >= 0.8)": False,
      "brief_negative: TAG accuracy >= 0.8x RP-only": True,
      "brief_negative: TAG negative rate - RP-only's <= +0.05": True,
      "brief_negative: TAG brief rate - RP-only's >= +0.05": True,
      "brief_negative: TAG elects arith_acc": True,
      "negative: down-weighting 0.5 -> 0.1 delays, not prevents (rollout negative >= 0.5)":
          False,  # weight 0.1 never reaches 0.5 in this report
  }
  assert {n: rows[n]["passed"] for n in expect} == expect
  assert "weighted_0.1: never" in rows[
      "negative: down-weighting 0.5 -> 0.1 delays, not prevents (rollout negative >= 0.5)"]["text"]
  # The default report shows no full-variant rows (their methods did not run).
  assert not any(r["full"] for r in summary.target_rows(_report(0)))


def test_summary_tabulates_seeds_against_targets(tmp_path):
  reports = [_report(0), _report(1, add_neg=0.7, amrp=0.42), _report(2)]
  for i, r in enumerate(reports):
    os.makedirs(tmp_path / f"s{i}")
    json.dump(r, open(tmp_path / f"s{i}" / "report.json", "w"))
  md = summary.main([str(tmp_path / f"s{i}") for i in range(3)] + ["--out", str(tmp_path / "s.md")])
  assert open(tmp_path / "s.md").read() == md
  res = {t["target"]: t for t in summary.check_targets(reports)}
  neg = res["negative: additive negative rate >= 0.8"]
  assert [c["passed"] for c in neg["per_seed"]] == [True, False, True]
  assert (neg["passes"], neg["seeds"]) == (2, 3)
  lines = md.splitlines()
  assert "| negative: additive negative rate >= 0.8 | yes (0.90) | NO (0.70) | yes (0.90) | 2/3 |" \
      in lines
  assert ("| acc_fmt_len: AMRP accuracy - static >= +0.05 | yes (+0.100) | NO (+0.020) | "
          "yes (+0.100) | 2/3 |") in lines
  assert "| additive | 0.200 +- 0.000 | 0.833 +- 0.115 | 0.300 +- 0.000 | 20.000 +- 0.000 |" \
      in lines
  assert "Run time per seed: 100 s, 100 s, 100 s." in md


def test_summary_rejects_missing_or_mismatched_reports(tmp_path):
  with pytest.raises(FileNotFoundError, match="no demo report"):
    summary.load_report(str(tmp_path))
  json.dump(_report(0), open(tmp_path / "a.json", "w"))
  json.dump({"brief": {}, "_meta": {"seed": 1}}, open(tmp_path / "b.json", "w"))
  with pytest.raises(ValueError, match="different tasks"):
    summary.main([str(tmp_path / "a.json"), str(tmp_path / "b.json")])


def test_figures_with_mr_rl_plots(tmp_path):
  def history(weights):
    rows = []
    for t in range(4):
      h = {"step": t, "reward/arith_acc/mean": 0.1 * t, "profile/arith_acc=0,arith_fmt=1": 0.5,
           "profile/arith_acc=1,arith_fmt=1": 0.5}
      if weights:
        h.update({"weights/arith_acc": 1.0 + 0.1 * t, "weights/arith_fmt": 1.0 - 0.1 * t})
      rows.append(h)
    return rows
  written = run.figures({"additive": history(False), "amrp_gdpo": history(True)},
                        str(tmp_path), "acc_fmt_len")
  assert [os.path.basename(p) for p in written] == ["acc_fmt_len_profiles.png",
                                                     "acc_fmt_len_weights.png"]
  assert all(os.path.getsize(p) > 1000 for p in written)
  assert [os.path.basename(p) for p in run.figures({"additive": history(False)}, str(tmp_path),
                                                    "brief")] == ["brief_profiles.png"]


# --------------------------------------------------------------------------------- smoke
def test_demo_smoke_writes_report(tmp_path):
  cfg = _demo_config("smoke")
  wd = str(tmp_path)
  report = pipelines.run(cfg, wd)
  with open(os.path.join(wd, "report.json")) as f:
    saved = json.load(f)
  assert saved["negative"].keys() == {"base", "additive", "tag"}
  for method, row in saved["negative"].items():
    assert 0.0 <= row["accuracy"] <= 1.0 and 0.0 <= row["aux_rate"] <= 1.0
    assert 0.0 <= row["joint_rate"] <= row["accuracy"]
    assert row["mean_length"] > 0
  for method in ("additive", "tag"):
    tr = saved["negative"][method]["trace"]
    assert tr["step"] == [0, 1] and saved["negative"][method]["seconds"] > 0
    shares = np.sum([v for v in tr["profiles"].values()], axis=0)
    assert all(k.startswith("acc=") for k in tr["profiles"])
    np.testing.assert_allclose(shares, 1.0, atol=1e-6)
  assert "weights" in saved["negative"]["additive"]["trace"]  # a linear rule logs its weights
  assert saved["negative"]["tag"]["anchor"] in ("arith_acc", "arith_negative")
  assert report["negative"]["tag"]["anchor"] == saved["negative"]["tag"]["anchor"]
  md = open(os.path.join(wd, "report.md")).read()
  assert "| additive |" in md and "anchor" in md
  # Every target is in report.md; those of absent tasks / methods say n/a.
  for row in saved["_targets"]:
    assert f"| {row['target']} | {summary.cell(row)} |" in md
  neg_rate = next(r for r in saved["_targets"]
                  if r["target"] == "negative: additive negative rate >= 0.8")
  assert neg_rate["passed"] in (True, False)
  assert f"| negative: additive negative rate >= 0.8 | {'yes' if neg_rate['passed'] else 'NO'}" \
      in md
  assert "| brief: TAG accuracy >= 0.95x RP-only | n/a |" in md
  assert os.path.getsize(os.path.join(wd, "negative_profiles.png")) > 1000
  assert not os.path.exists(os.path.join(wd, "negative_weights.png"))  # no AMRP run
  drift = json.load(open(os.path.join(wd, "negative", "tag", "drift.json")))
  assert [c["channel"] for c in drift["channels"]] == ["arith_acc", "arith_negative"]
  assert os.path.exists(os.path.join(wd, "negative", "additive", "metrics.jsonl"))


@pytest.mark.parametrize("field,value", [("rewards.channels", "arith_acc,my_rewards:concise"),
                                         ("aggregator.name", "amrp"),
                                         ("advantage.name", "ppo")])
def test_the_demo_refuses_fields_it_would_replace(tmp_path, field, value):
  """The demo sets each task's channels and each method's aggregator and advantage: a value of
  the user's there is refused before any training, naming it and the way out."""
  from mr_rl.errors import ConfigError
  c = _demo_config("smoke")
  section, name = field.split(".")
  c[section][name] = value
  with pytest.raises(ConfigError, match=rf"config.{field}='{value}' would be replaced\. .*"
                                        r"--config.pipeline=train"):
    pipelines.PIPELINES.get("demo")(c, str(tmp_path / "wd"))
  assert not (tmp_path / "wd").exists()


def test_plots_and_export_of_a_demo_workdir_name_the_runs_inside(tmp_path):
  """`python -m mr_rl.plots W` / `mr_rl.export --workdir=W` on a demo workdir (its runs are in
  W/<task>/<method>) say where the runs are."""
  from mr_rl import export, plots
  for run_dir in ("brief/tag", "brief/additive", "negative/tag"):
    (tmp_path / run_dir).mkdir(parents=True)
    (tmp_path / run_dir / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
  with pytest.raises(FileNotFoundError, match=rf"holds 3 runs .*W/<task>/<method>\): "
                                              rf"{tmp_path}/brief/additive, {tmp_path}/brief/tag"):
    plots.load_history(str(tmp_path))
  with pytest.raises(FileNotFoundError, match=r"no checkpoints under .*holds 3 runs"):
    export.export(str(tmp_path), out=str(tmp_path / "out"))
