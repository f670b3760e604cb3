"""DHKD's ablation options (the paper's Tables 5, 8, 9): the loss on the auxiliary head can be the plain
BinaryKL instead of BinaryKL-Norm; nothing else changes."""

from __future__ import annotations

import torch

from kdcollapse.config import method_config
from kdcollapse.losses import binary_kl_loss, binary_kl_norm_loss
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model

K = 10


def dhkd(**options):
    torch.manual_seed(0)
    student = create_model("mlp", K, in_channels=1, input_size=8, hidden=(16,))
    teacher = FrozenTeacher(create_model("mlp", K, in_channels=1, input_size=8, hidden=(12,)))
    return build_method(method_config({"name": "dhkd", "alpha": 0.7, **options}), student, num_classes=K,
                        teacher=teacher)


def test_the_auxiliary_head_takes_binary_kl_or_binary_kl_norm():
    x, y = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(1)), torch.arange(12) % K
    for aux_loss, loss in (("binary_kl_norm", binary_kl_norm_loss), ("binary_kl", binary_kl_loss)):
        m = dhkd(aux_loss=aux_loss)
        out = m(x, y)
        aux = m.aux_head(m.student.forward_features(x))
        torch.testing.assert_close(out[aux_loss], 0.7 * loss(aux, m.teacher.logits(x), 2.0))
        torch.testing.assert_close(out["loss"], out["ce"] + out[aux_loss])
    assert not torch.allclose(dhkd(aux_loss="binary_kl")(x, y)["loss"], dhkd()(x, y)["loss"])
