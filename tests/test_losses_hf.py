"""The Hugging Face Trainer recipe of docs/losses.md on tiny randomly initialised GPT-2 models."""

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.losses import kd_loss, shift_for_causal_lm

transformers = pytest.importorskip(
    "transformers", reason="transformers is not installed (pip install 'kdcollapse[llm]')")

STUDENT_VOCAB, TEACHER_VOCAB = 100, 128  # the teacher's vocabulary is padded


def tiny_gpt2(vocab_size, seed):
    torch.manual_seed(seed)
    config = transformers.GPT2Config(vocab_size=vocab_size, n_layer=1, n_embd=32, n_head=2,
                                     n_positions=16, bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def lm_batch():
    g = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, STUDENT_VOCAB, (3, 8), generator=g)
    attention_mask = torch.ones(3, 8, dtype=torch.long)  # int64, as tokenizers return it
    attention_mask[1, 5:] = attention_mask[2, 2:] = 0  # right padding
    labels = input_ids.masked_fill(attention_mask == 0, -100)
    labels[0, 3] = -100  # e.g. a prompt token that is not trained on
    return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def distillation_loss(student, teacher, inputs, temperature=2.0, kd_weight=0.5):
    """The body of the recipe's ``compute_loss`` override (docs/losses.md)."""
    outputs = student(**inputs)  # HF's own shifted cross-entropy in outputs.loss
    with torch.no_grad():
        teacher_logits = teacher(input_ids=inputs["input_ids"],
                                 attention_mask=inputs["attention_mask"]).logits
    batch = shift_for_causal_lm(outputs.logits, teacher_logits, inputs["labels"],
                                inputs["attention_mask"])
    kd = kd_loss(batch.student, batch.teacher, temperature, mask=batch.mask,
                 vocab_size=student.config.vocab_size)
    return (1 - kd_weight) * outputs.loss + kd_weight * kd, outputs, kd


def test_recipe_matches_the_model_loss_and_a_per_token_loop():
    student, teacher = tiny_gpt2(STUDENT_VOCAB, 0), tiny_gpt2(TEACHER_VOCAB, 1).eval()
    inputs = lm_batch()
    loss, outputs, kd = distillation_loss(student, teacher, inputs)
    batch = shift_for_causal_lm(outputs.logits, None, inputs["labels"], inputs["attention_mask"])
    # the shift pairs exactly the (logit, label) pairs of the model's own causal-LM loss
    torch.testing.assert_close(F.cross_entropy(batch.student[batch.mask], batch.labels[batch.mask]),
                               outputs.loss)
    teacher_logits = teacher(**{k: v for k, v in inputs.items() if k != "labels"}).logits
    labels = inputs["labels"]
    cut = teacher_logits[..., :STUDENT_VOCAB]
    per_token = [kd_loss(outputs.logits[b, t:t + 1], cut[b, t:t + 1], 2.0)
                 for b in range(3) for t in range(7) if labels[b, t + 1] != -100]
    assert len(per_token) == int(batch.mask.sum()) == 11
    torch.testing.assert_close(kd, torch.stack(per_token).mean())
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in student.parameters() if p.grad is not None)


def test_trainer_compute_loss_override_trains(tmp_path):
    pytest.importorskip("accelerate", reason="transformers' Trainer needs accelerate")

    class DistillationTrainer(transformers.Trainer):
        def __init__(self, *args, teacher, **kwargs):
            super().__init__(*args, **kwargs)
            self.teacher = teacher.eval().requires_grad_(False).to(self.args.device)

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            loss, outputs, _ = distillation_loss(model, self.teacher, inputs)
            return (loss, outputs) if return_outputs else loss

    student, teacher = tiny_gpt2(STUDENT_VOCAB, 0), tiny_gpt2(TEACHER_VOCAB, 1)
    inputs = lm_batch()
    rows = [{k: v[i] for k, v in inputs.items()} for i in range(3)]
    before = [p.detach().clone() for p in student.parameters()]
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path), max_steps=2, per_device_train_batch_size=3, learning_rate=1e-2,
        report_to=[], save_strategy="no", use_cpu=True, logging_steps=1)
    trainer = DistillationTrainer(model=student, args=args, train_dataset=rows, teacher=teacher)
    result = trainer.train()
    assert torch.isfinite(torch.tensor(result.training_loss))
    assert any(not torch.equal(p, q) for p, q in zip(student.parameters(), before))
