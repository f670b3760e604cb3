"""Sampling completions from a causal LM with an explicit ``torch.Generator``: the on-policy (student) and
sequence-level (teacher) samples of GKD, reproducible under a seed.

``transformers``' ``generate`` draws from the global RNG; here every draw takes ``generator``, so a run
that re-seeds it per step repeats its samples exactly (and resumes bit for bit). The loop is the plain
one: the prompt once, then one token at a time with the model's key-value cache; only the last position's
logits are formed (``logits_to_keep=1`` where the model takes it, as ``generate`` does).
"""

from __future__ import annotations

import inspect
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

from kdcollapse.errors import KdcollapseError


class Completions(NamedTuple):
    """``sequences`` (B, P + M): the prompts followed by the sampled tokens, every token after a row's first
    end-of-text replaced by it; ``completion_mask`` (B, M) bool: the sampled tokens up to and including
    that first end-of-text (TRL's GKDTrainer masks the same)."""

    sequences: torch.Tensor
    completion_mask: torch.Tensor


@torch.no_grad()
def sample_completions(model: Any, prompts: torch.Tensor, max_new_tokens: int, *, temperature: float = 1.0,
                       generator: torch.Generator | None = None, eos_token_id: int | None = None,
                       vocab_size: int | None = None) -> Completions:
    """Sample ``max_new_tokens`` tokens after each row of ``prompts`` (B, P) from softmax(z / ``temperature``)
    (``temperature=0``: the most likely token), drawing with ``generator``. ``vocab_size`` cuts a head padded
    beyond the tokenizer, so no padding row is ever sampled. The model is run in eval mode and left as it
    was found."""
    if prompts.ndim != 2 or prompts.shape[1] < 1:
        raise KdcollapseError(f"prompts must be (batch, length >= 1) token ids, got shape {tuple(prompts.shape)}")
    if not (isinstance(max_new_tokens, int) and max_new_tokens >= 1):
        raise KdcollapseError(f"max_new_tokens must be a positive int, got {max_new_tokens!r}")
    if not temperature >= 0:
        raise KdcollapseError(f"the sampling temperature must be >= 0, got {temperature!r}")
    was_training = model.training
    model.eval()
    keywords = inspect.signature(model.forward).parameters
    last = {"logits_to_keep": 1} if "logits_to_keep" in keywords else {}
    try:
        out = model(prompts, use_cache=True, **last)
        tokens = []
        for i in range(max_new_tokens):
            logits = out.logits[:, -1, :vocab_size].float()
            if temperature == 0:
                token = logits.argmax(-1, keepdim=True)
            else:
                token = torch.multinomial(F.softmax(logits / temperature, -1), 1, generator=generator)
            tokens.append(token)
            if i + 1 < max_new_tokens:
                out = model(token, use_cache=True, **last, **_cache_of(keywords, out))
    finally:
        model.train(was_training)
    completion = torch.cat(tokens, 1)
    mask = torch.ones_like(completion, dtype=torch.bool)
    if eos_token_id is not None:
        is_eos = completion == eos_token_id
        mask = is_eos.long().cumsum(1) - is_eos.long() == 0  # up to and including the first end-of-text
        completion = torch.where(mask, completion, eos_token_id)
    return Completions(torch.cat([prompts, completion.to(prompts.dtype)], 1), mask)


def _cache_of(keywords: Any, out: Any) -> dict:
    """The key-value cache of ``out`` as the model whose forward takes ``keywords`` wants it: ``cache`` from
    transformers 5.2x on, ``past_key_values`` before."""
    if "cache" in keywords:
        return {"cache": out.cache}
    return {"past_key_values": out.past_key_values}
