"""Multi-objective reward model (ArmoRM layout) on the Flax Llama backbone, and its channels.

Modules: ``loading`` (checkpoint -> backbone params + head), ``model``
(``MultiObjectiveRewardModel``: encoding, padding, the jitted forward), ``scorer``
(``RewardModelScorer``, ``get_scorer``: the shared cache and micro-batcher) and ``channels``
(the registered channels). Everything public is exported here.

AMRP open-ended alignment (docs/methods.md §7; AMRP section 5 and appendix B.2): the reward
profile is ``[r_help, r_corr, r_coh]``, the helpfulness, correctness and coherence scores of
ArmoRM-Llama3-8B-v0.1 (Wang et al. 2024a), and every reward is scaled to [0, 1] (B.2).

Model (``RLHFlow/ArmoRM-Llama3-8B-v0.1``, remote class ``LlamaForRewardModelWithGating``): a
Llama-3-8B backbone, a ``regression_layer`` Linear(hidden, 19, bias=False) applied to the
final-normed hidden state of the LAST token of the chat-templated conversation, plus a
gating network and a ``reward_transform_matrix`` that only form the overall preference
score. We compute the 19 per-objective rewards (the model card's ``output.rewards``); the
gating tensors are read past and ignored. Objective order: ``ARMORM_OBJECTIVES`` (the model
card's ``attributes`` list; objectives 0-4 are the HelpSteer attributes),
so AMRP's help / corr / coh are objectives 0 / 1 / 2. A plain ``score.weight`` head
(transformers ``LlamaForSequenceClassification``, [num_labels, hidden], no bias) loads the
same way; objectives are then its labels in order.

Input and pooling (exact): the conversation is ``messages + [{"role": "assistant",
"content": response}]`` rendered and tokenized by the reward model's own chat template
(``apply_chat_template(..., tokenize=True, add_generation_prompt=False)``, as in the model
card's demo), except that the response is untrusted: text in it that spells a special token
(``<|eot_id|><|start_header_id|>user``...) is tokenized as plain characters
(``split_special_tokens``) between the template's own ids, so a response cannot close its
turn or forge new ones (``MultiObjectiveRewardModel.encode``); the pooled token is the last token of that sequence (for Llama 3's template,
the ``<|eot_id|>`` closing the assistant turn), i.e. the last position whose attention mask
is 1. Batches are padded on the right (default) or left; positions come from the mask, so
the two give the same scores, equal to scoring each sequence alone (the model card's
batch-1 call and transformers' rightmost-non-pad pooling).

Rescaling to [0, 1] (``rescale``): AMRP says only that rewards are scaled to [0, 1]. ArmoRM
regresses HelpSteer ratings r in {0..4} onto (r + 0.5) / 5 (the model card maps predictions
back with ``rating = 5 x - 0.5``), so ``rescale="helpsteer"`` is rating / 4 =
``clip((x - 0.1) / 0.8, 0, 1)`` **(project definition)**; ``rescale=(lo, hi)`` is
``clip((x - lo) / (hi - lo), 0, 1)``; ``None`` keeps the raw head output.

Channels (kind "thread"; the model lives in the trainer process): ``armorm_helpfulness``,
``armorm_correctness``, ``armorm_coherence`` and the generic ``reward_model(objective=...)``.
All channels with the same (path, dtype, head, mesh, max_len) share ONE loaded model and one
``RewardModelScorer``: an LRU of per-(conversation, response) score vectors with in-flight
de-duplication (the three AMRP channels cost one forward per response) and a micro-batcher
that collects concurrent calls (the runner's threads) into one forward of up to
``max_batch`` sequences. ``scorer.score_many`` scores a whole rollout in batches up front, so
the channels then only read the cache. The prompt comes from ``example["messages"]`` (chat
turns) or ``example["prompt"]`` (one user turn).
"""

from mr_rl.rewards.reward_model.channels import (HELPSTEER_RANGE, armorm_coherence,
                                                 armorm_correctness, armorm_helpfulness,
                                                 conversation_of, reward_model,
                                                 reward_model_channel)
from mr_rl.rewards.reward_model.loading import (ARMORM_HUB, ARMORM_OBJECTIVES, HEAD_LAYOUTS,
                                                LoadedRewardModel, load_reward_model)
from mr_rl.rewards.reward_model.model import MultiObjectiveRewardModel, normalise_conversation
from mr_rl.rewards.reward_model.scorer import RewardModelScorer, get_scorer

__all__ = ["ARMORM_HUB", "ARMORM_OBJECTIVES", "HEAD_LAYOUTS", "HELPSTEER_RANGE",
           "LoadedRewardModel", "MultiObjectiveRewardModel", "RewardModelScorer",
           "armorm_coherence", "armorm_correctness", "armorm_helpfulness", "conversation_of",
           "get_scorer", "load_reward_model", "normalise_conversation", "reward_model",
           "reward_model_channel"]
