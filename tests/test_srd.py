"""SRD (Miles & Mikolajczyk, AAAI 2024) against torchdistill's official code (``SRDLoss`` and ``SRDModelWrapper``
at yoshitomo-matsubara/torchdistill@3e4373c, torchdistill/losses/mid_level.py and torchdistill/models/wrapper.py,
transcribed below), and trained through ``distill``."""

import pytest
import torch
from torch import nn

from kdcollapse.losses import srd_loss
from kdcollapse.train import fit

TORCHDISTILL = "yoshitomo-matsubara/torchdistill@3e4373c"


# torchdistill SRDLoss.forward, literally (feature paths resolved to the tensors they read)
def official_srd_loss(student_features, teacher_features, student_logits, teacher_logits, exponent=4.0,
                      temperature=1.0):
    criterion = nn.KLDivLoss(reduction="batchmean")
    diff_features = torch.abs(student_features - teacher_features)
    feat_distill_loss = torch.log(diff_features.pow(exponent).sum())
    kl_loss = criterion(torch.log_softmax(student_logits / temperature, dim=1),
                        torch.softmax(teacher_logits / temperature, dim=1))
    return 2 * feat_distill_loss + kl_loss


# SRDModelWrapper.secondary_forward: z.mean(-1).mean(-1); the student's linear; norm_layer (BatchNorm1d)
def official_wrapper(z, linear, norm):
    z = z.mean(-1).mean(-1)
    if linear is not None:
        z = linear(z)
    return norm(z)


def test_the_method_equals_torchdistill_on_the_same_modules():
    """The method's loss = torchdistill's CE + SRDLoss, on the student's pooled last stage through the method's own
    projector and BatchNorm (train mode) and the teacher's through a fresh affine-free BatchNorm in train mode (the
    mode torchdistill leaves its teacher wrapper in), the teacher's BatchNorms on batch statistics."""
    from kdcollapse.config import method_config
    from kdcollapse.methods import FrozenTeacher, build_method
    from kdcollapse.models import create_model

    torch.manual_seed(0)
    student, teacher_model = create_model("convnet_small", 10, in_channels=1), create_model("convnet", 10, in_channels=1)
    method = build_method(method_config({"name": "srd"}), student, num_classes=10, teacher=FrozenTeacher(teacher_model))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(16, 1, 8, 8, generator=g), torch.randint(0, 10, (16,), generator=g)
    method.train()
    out = method(x, y)
    h_s, maps = student.forward_intermediates(x, [len(student.feature_info) - 1])
    teacher_model.train()  # torchdistill's teacher: never put in eval mode while training
    with torch.no_grad():
        h_t, maps_t = teacher_model.forward_intermediates(x, [len(teacher_model.feature_info) - 1])
        z_t = teacher_model.forward_head(h_t)
    norm_t = nn.BatchNorm1d(h_t.shape[1], eps=0.0001, affine=False)  # the teacher wrapper's norm_kwargs
    p = official_wrapper(maps[0], method.projector, method.norm)
    q = official_wrapper(maps_t[0], None, norm_t)
    expected = nn.functional.cross_entropy(student.forward_head(h_s), y) + official_srd_loss(p, q, student.forward_head(h_s), z_t)
    assert float(out["loss"]) == pytest.approx(float(expected), rel=1e-5), TORCHDISTILL
    assert torch.allclose(h_s, maps[0].mean((-1, -2)), atol=1e-6)  # the penultimate feature is the pooled last stage


def test_srd_trains_through_distill(tiny_config, tmp_path):
    conv = ("model.name=convnet_small", "model.kwargs={}")
    teacher = fit(tiny_config(tmp_path / "t", *conv, "train.epochs=1")).run_dir
    run = fit(tiny_config(tmp_path / "s", *conv, "method.name=srd", f"teacher.checkpoint={teacher}", "train.epochs=1"))
    assert (run.run_dir / "model.safetensors").exists()


def test_srd_loss_is_the_official_feature_term():
    g = torch.Generator().manual_seed(0)
    p, q = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    z_s, z_t = torch.randn(8, 10, generator=g), torch.randn(8, 10, generator=g)
    official = official_srd_loss(p, q, z_s, z_t)
    kl = nn.KLDivLoss(reduction="batchmean")(torch.log_softmax(z_s, 1), torch.softmax(z_t, 1))
    assert float(2 * srd_loss(p, q) + kl) == pytest.approx(float(official), rel=1e-6), TORCHDISTILL
    assert float(srd_loss(p, q, 2.0)) == pytest.approx(float(torch.log((p - q).square().sum())), rel=1e-6)
