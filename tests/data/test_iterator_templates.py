"""Resumable iteration, the Example record and prompt templates of mr_rl.data."""

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from mr_rl import data
from mr_rl.data import templates


def _examples(n):
  return [data.Example.single_turn(f"toy/{i}", "toy", f"question {i}", str(i)) for i in range(n)]


# ------------------------------------------------------------------------- iterator

def _run(it, n):
  return [[e.uid for e in next(it)] for _ in range(n)]


@pytest.mark.parametrize("drop_remainder", [True, False])
def test_stop_anywhere_and_restore_gives_identical_continuation(drop_remainder):
  exs = _examples(23)
  ref = _run(data.ResumableIterator(exs, 5, seed=7, drop_remainder=drop_remainder), 20)
  for stop in range(20):
    it = data.ResumableIterator(exs, 5, seed=7, drop_remainder=drop_remainder)
    head = _run(it, stop)
    st = it.state()
    assert set(st) == {"epoch", "index", "seed"} and all(type(v) is int for v in st.values())
    fresh = data.ResumableIterator(exs, 5, seed=7, drop_remainder=drop_remainder)
    fresh.restore(dict(st))
    assert head + _run(fresh, 20 - stop) == ref


def test_epochs_are_distinct_permutations():
  exs = _examples(12)
  it = data.ResumableIterator(exs, 4, seed=0)
  e0 = sum(_run(it, 3), [])
  assert it.state() == {"epoch": 1, "index": 0, "seed": 0}
  e1 = sum(_run(it, 3), [])
  assert sorted(e0) == sorted(e1) == sorted(e.uid for e in exs)
  assert e0 != e1
  plain = data.ResumableIterator(exs, 4, shuffle=False, num_epochs=2)
  got = [b for b in plain]
  assert len(got) == 6 and [e.uid for e in got[0]] == ["toy/0", "toy/1", "toy/2", "toy/3"]
  # A different seed gives a different order.
  assert _run(data.ResumableIterator(exs, 4, seed=1), 3) != _run(
      data.ResumableIterator(exs, 4, seed=0), 3)


def test_drop_remainder_and_partial_batches():
  exs = _examples(10)
  sizes = [len(b) for b in data.ResumableIterator(exs, 4, num_epochs=2)]
  assert sizes == [4, 4, 4, 4]
  sizes = [len(b) for b in data.ResumableIterator(exs, 4, num_epochs=1, drop_remainder=False)]
  assert sizes == [4, 4, 2]


def test_process_sharding_partitions_global_batch():
  exs = _examples(16)
  glob = _run(data.ResumableIterator(exs, 8, seed=3), 4)
  shards = [_run(data.ResumableIterator(exs, 8, seed=3, process_index=p, process_count=4), 4)
            for p in range(4)]
  for step in range(4):
    assert sum((s[step] for s in shards), []) == glob[step]


def test_iterator_bad_arguments():
  exs = _examples(6)
  it = data.ResumableIterator(exs, 2, seed=1)
  with pytest.raises(ValueError, match="seed"):
    it.restore({"epoch": 0, "index": 0, "seed": 2})
  with pytest.raises(ValueError, match="keys"):
    it.restore({"epoch": 0, "index": 0})
  with pytest.raises(ValueError, match="out of range"):
    it.restore({"epoch": 0, "index": 7, "seed": 1})
  with pytest.raises(ValueError, match="batch_size"):
    data.ResumableIterator(exs, 0)
  with pytest.raises(ValueError, match="no batch"):
    data.ResumableIterator(exs, 7)
  with pytest.raises(ValueError, match="divisible"):
    data.ResumableIterator(exs, 3, process_count=2)


# --------------------------------------------------------------------------- Example

def test_example_validation_and_immutability():
  ex = data.Example.single_turn("t/1", "t", "hi", None, docs=[{"title": "a", "text": "b"}])
  with pytest.raises(TypeError):
    ex.metadata["docs"] = []  # read-only
  assert ex.metadata["docs"][0]["title"] == "a"
  with pytest.raises(ValueError, match="end with a user turn"):
    data.Example("t/2", "t", ({"role": "assistant", "content": "x"},))
  with pytest.raises(ValueError, match="role"):
    data.Example("t/3", "t", ({"role": "bot", "content": "x"},))
  flat = ex.as_mapping()
  assert flat["uid"] == "t/1" and flat["reference"] is None and flat["docs"][0]["text"] == "b"
  reps = data.replicate([ex], 3)
  assert [r.uid for r in reps] == ["t/1#r0", "t/1#r1", "t/1#r2"]


# ------------------------------------------------------------------------- templates

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                 "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
  vocab = {w: i for i, w in enumerate(["[UNK]", "[PAD]", "</s>", "what", "is", "2", "+", "?"])}
  tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  hf = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                               eos_token="</s>")
  hf.chat_template = CHAT_TEMPLATE
  d = tmp_path_factory.mktemp("tok")
  hf.save_pretrained(str(d))
  return AutoTokenizer.from_pretrained(str(d))  # the template survives a save/load by path


def test_chat_template_via_tokenizer(tiny_tokenizer):
  ex = data.Example.single_turn("m/1", "math500", "what is 2 + 2 ?", "4")
  tpl = data.make_template("amrp_math", model="Qwen/Qwen3-4B-Instruct-2507")
  assert tpl.style == "chat"
  text = tpl.render(ex, tiny_tokenizer)
  expected = tiny_tokenizer.apply_chat_template(
      [{"role": "system", "content": templates.AMRP_MATH_SYSTEM},
       {"role": "user", "content": "what is 2 + 2 ?"}], tokenize=False,
      add_generation_prompt=True)
  assert text == expected
  assert text.startswith("<|system|>\n") and text.endswith("<|assistant|>\n")
  assert "<reasoning>" in text and "<answer>" in text
  tag = data.make_template("tag_math", style="chat").render(ex, tiny_tokenizer)
  assert tag == ("<|user|>\nwhat is 2 + 2 ?\n\n" + templates.TAG_BOXED_INSTRUCTION
                 + "<|end|>\n<|assistant|>\n")


def test_plain_template_for_base_models():
  ex = data.Example.single_turn("m/1", "math500", "What is 2+2?", "4")
  tpl = data.make_template("amrp_math", model="deepseek-ai/deepseek-math-7b-base")
  assert tpl.render(ex) == (templates.AMRP_MATH_SYSTEM + "\n\nUser: What is 2+2?\nAssistant:")
  tag = data.make_template("tag_math", model="Qwen3-1.7B-Base")
  assert tag.render(ex) == ("User: What is 2+2?\n\n" + templates.TAG_BOXED_INSTRUCTION
                            + "\nAssistant:")
  multi = data.Example("h/1", "helpsteer2", ({"role": "user", "content": "Hi"},
                                             {"role": "assistant", "content": "Hello"},
                                             {"role": "user", "content": "Joke?"}))
  assert data.make_template("helpsteer2", style="plain").render(multi) == (
      "User: Hi\nAssistant: Hello\nUser: Joke?\nAssistant:")


@pytest.mark.parametrize("task", ["amrp_math", "tag_math", "tag_code", "alce", "helpsteer2"])
def test_a_plain_template_as_a_chat_template_writes_the_same_prompt(tiny_tokenizer, task):
  """The Jinja an export carries (`PromptTemplate.jinja`) renders what `render` does."""
  tpl = data.make_template(task, style="plain")
  for ex in (data.Example.single_turn("m/1", "math500", "What is 2+2?", "4"),
             data.Example("h/1", "helpsteer2", ({"role": "user", "content": "Hi"},
                                                {"role": "assistant", "content": "Hello"},
                                                {"role": "user", "content": "Joke?"}))):
    got = tiny_tokenizer.apply_chat_template([dict(m) for m in ex.messages],
                                             chat_template=tpl.jinja(), tokenize=False,
                                             add_generation_prompt=True)
    assert got == tpl.render(ex)
  assert templates.chat_template_of_run(task, "Qwen3-1.7B-Base") == tpl.jinja()
  assert templates.chat_template_of_run(task, "Qwen/Qwen3-4B-Instruct-2507") is None  # chat
  with pytest.raises(ValueError, match="only plain-style templates"):
    data.make_template(task, style="chat").jinja()


def test_an_untemplated_run_as_a_chat_template(tiny_tokenizer):
  jinja = templates.chat_template_of_run("", "any/model")
  assert jinja == templates.UNTEMPLATED_JINJA
  text = tiny_tokenizer.apply_chat_template([{"role": "user", "content": "what is 2"}],
                                            chat_template=jinja, tokenize=False,
                                            add_generation_prompt=True)
  assert text == "what is 2"  # (this tokenizer has no BOS; the demo's writes it first)
  with pytest.raises(Exception, match="give exactly one user message"):
    tiny_tokenizer.apply_chat_template([{"role": "system", "content": "s"},
                                        {"role": "user", "content": "q"}],
                                       chat_template=jinja, tokenize=False)


def test_template_errors():
  ex = data.Example.single_turn("m/1", "math500", "q", "4")
  tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(
      vocab={"[UNK]": 0}, unk_token="[UNK]")), unk_token="[UNK]")
  with pytest.raises(ValueError, match="chat_template"):
    data.make_template("alce", style="chat").render(ex, tok)
  with pytest.raises(ValueError, match="no known template style"):
    data.style_for_model("gpt2")
  with pytest.raises(ValueError, match="style"):
    data.PromptTemplate(style="fancy")
  with pytest.raises(ValueError, match="task"):
    data.make_template("poetry", style="plain")
