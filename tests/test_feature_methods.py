"""The methods of issue 23 (DIST; FitNet, AT, OFD once the feature seam exists): their losses as the
official code combines them, with the official default weights."""

import torch
import torch.nn.functional as F

from kdcollapse.config import method_config
from kdcollapse.losses import dist_loss, pkt_loss
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model

K = 10


def mlp(hidden, seed):
    torch.manual_seed(seed)
    return create_model("mlp", K, in_channels=1, input_size=8, hidden=hidden)


def test_dist_method_is_ce_plus_twice_dist_at_tau_4():
    """hunto/image_classification_sota/configs/strategies/distill/dist_cifar.yaml: ori_loss_weight 1,
    kd_loss_weight 2, kd dist_t4 (β = γ = 1, τ = 4)."""
    student, teacher = mlp((16,), 0), FrozenTeacher(mlp((12,), 1))
    method = build_method(method_config({"name": "dist"}), student, num_classes=K, teacher=teacher)
    x, y = torch.randn(12, 1, 8, 8), torch.arange(12) % K
    out = method(x, y)
    logits, teacher_logits = student(x), teacher.logits(x)
    expected = F.cross_entropy(logits, y) + 2 * dist_loss(logits, teacher_logits, 1.0, 1.0, 4.0)
    torch.testing.assert_close(out["loss"], expected)
    torch.testing.assert_close(out["ce"] + out["dist"], out["loss"])


def test_pkt_method_is_ce_plus_weighted_pkt_on_penultimate_features():
    """mdistiller PKT.forward_train: CE + 30000·pkt_loss(pooled_feat_s, pooled_feat_t)."""
    student, teacher = mlp((16,), 0), FrozenTeacher(mlp((12,), 1))
    method = build_method(method_config({"name": "pkt"}), student, num_classes=K, teacher=teacher)
    x, y = torch.randn(12, 1, 8, 8), torch.arange(12) % K
    out = method(x, y)
    h = student.forward_features(x)
    expected = F.cross_entropy(student.forward_head(h), y) + 30000 * pkt_loss(h, teacher(x)[0])
    torch.testing.assert_close(out["loss"], expected)
