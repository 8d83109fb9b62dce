"""benchmarks/multiturn_trl.py's scripted checkpoint: transformers and mr_rl compute the same
policy (the chain's continuation probabilities as designed), both sides feed the same prompt
and tool-answer ids, and the policy's call parses as a calculator call for TRL's parser and
mr_rl's `HermesFormat`. Skipped where TRL (the `bench` extra) is not installed."""

from __future__ import annotations

import types

import numpy as np
import pytest

BENCH = "multiturn_trl"  # the `bench` fixture (tests/benchmarks/conftest.py)
F = 8


@pytest.fixture(scope="module")
def ckpt(bench, tmp_path_factory):
  pytest.importorskip("trl")
  from transformers import AutoTokenizer
  info = bench.write_scripted_qwen3(str(tmp_path_factory.mktemp("scripted")), F)
  tok = AutoTokenizer.from_pretrained(info["path"])
  calc = bench.make_calculator(0.0)
  prompt = tok.apply_chat_template(bench.prompts(1)[0], tools=[calc], tokenize=True,
                                   add_generation_prompt=True, return_dict=False)
  return info, tok, calc, list(prompt)


def _logprobs_hf_and_mr_rl(path, ids):
  import jax
  import jax.numpy as jnp
  import torch
  from transformers import AutoModelForCausalLM
  from mr_rl import models
  hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
  with torch.no_grad():
    a = torch.log_softmax(hf(torch.tensor([ids])).logits[0, -1], -1).numpy()
  model, params = models.load_pretrained(path)[:2]
  x = jnp.asarray([ids])
  out = model.apply({"params": params}, x, jnp.arange(len(ids))[None],
                    kv_mask_NC=jnp.ones_like(x, bool))
  out = out[0] if isinstance(out, tuple) else out
  return a, np.asarray(jax.nn.log_softmax(out[0, -1]))


def test_the_scripted_policy_is_the_same_in_both_frameworks(bench, ckpt):
  info, tok, _, prompt = ckpt
  a, b = _logprobs_hf_and_mr_rl(info["path"], prompt)
  first = int(np.argmax(a))
  assert int(np.argmax(b)) == first and a[first] > -1e-3  # the first filler word, surely
  a, b = _logprobs_hf_and_mr_rl(info["path"], prompt + [first])
  np.testing.assert_allclose(np.exp(a), np.exp(b), atol=1e-4)
  top = np.sort(np.exp(a))[::-1]
  np.testing.assert_allclose(top[:2], [1 - 1 / F, 1 / F], atol=0.02)  # next word, or the call
  assert int(np.argsort(-a)[1]) == tok.convert_tokens_to_ids("<tool_call>")


def test_both_sides_feed_the_same_ids(bench, ckpt):
  from transformers.utils import get_json_schema
  from trl import GRPOTrainer
  from mr_rl.multiturn import render as render_lib
  _, tok, calc, prompt = ckpt
  render = render_lib.ChatRenderer(tok, end_of_turn=bench.EOT, tools=[get_json_schema(calc)])
  assert render.prompt_ids(bench.prompts(1)[0]) == prompt
  trl = types.SimpleNamespace(processing_class=tok, _tokenizer=tok, chat_template=None,
                              chat_template_kwargs={}, _is_vlm=False)
  answer = [{"role": "tool", "name": "calculator", "content": calc("7+5")}]
  assert GRPOTrainer._get_tool_suffix_ids(trl, answer) == render.observation_ids(answer)[0]
  assert prompt[-1] == render.observation_ids(answer)[0][-1]  # the chain restarts after both


def test_the_call_parses_on_both_sides(bench, ckpt):
  from trl.chat_template_utils import add_response_schema, parse_response
  from mr_rl.multiturn import tools
  _, tok, calc, prompt = ckpt
  ids = tok.convert_tokens_to_ids(["<tool_call>", *bench.CALL_PIECES, "</tool_call>", bench.EOT])
  parsed = parse_response(add_response_schema(tok), ids, prefix=prompt, tools=[calc])
  call = {"name": "calculator", "arguments": {"expression": "7+5"}}
  assert parsed["tool_calls"] == [{"type": "function", "function": call}]
  got = tools.HermesFormat().parse(tok.decode(ids[:-1]), {"calculator": calc})
  assert (got.name, dict(got.arguments), got.error) == ("calculator", call["arguments"], None)
