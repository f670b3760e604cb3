"""MLKD: its strong augmentation (each operation against PIL, Cutout against the official code, views
drawn from the loader's plan) and its loss against a literal transcription of the official code."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import method_config
from kdcollapse.data import Augment, TensorDataset, make_loader
from kdcollapse.data._randaugment import OPERATIONS, _cutout, rand_augment_batch
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model
from test_losses_logit_methods import official_bc, official_cc, official_normalize

Image = pytest.importorskip("PIL.Image")
from PIL import ImageDraw, ImageEnhance, ImageOps  # noqa: E402

# PIL operations of the official augment_list() (Jin-Ying/Multi-Level-Logit-Distillation @
# 5ee473fcf193dfb00a0598b64d0acfe6ad58a482, mdistiller/dataset/cifar100.py)
PIL_OPS = {
    "auto_contrast": lambda img, v: ImageOps.autocontrast(img),
    "brightness": lambda img, v: ImageEnhance.Brightness(img).enhance(v),
    "color": lambda img, v: ImageEnhance.Color(img).enhance(v),
    "contrast": lambda img, v: ImageEnhance.Contrast(img).enhance(v),
    "equalize": lambda img, v: ImageOps.equalize(img),
    "identity": lambda img, v: img,
    "posterize": lambda img, v: ImageOps.posterize(img, max(1, int(v))),
    "rotate": lambda img, v: img.rotate(v),
    "sharpness": lambda img, v: ImageEnhance.Sharpness(img).enhance(v),
    "shear_x": lambda img, v: img.transform(img.size, Image.AFFINE, (1, v, 0, 0, 1, 0)),
    "shear_y": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, 0, v, 1, 0)),
    "solarize": lambda img, v: ImageOps.solarize(img, v),
    "translate_x": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, v * img.size[0], 0, 1, 0)),
    "translate_y": lambda img, v: img.transform(img.size, Image.AFFINE, (1, 0, 0, 0, 1, v * img.size[1])),
}


def official_cutout_abs(img, v, x0, y0):
    """Same file, CutoutAbs, with its two np.random.uniform draws passed in (x0, y0)."""
    w, h = img.size
    x0 = int(max(0, x0 - v / 2.))
    y0 = int(max(0, y0 - v / 2.))
    x1 = min(w, x0 + v)
    y1 = min(h, y0 + v)
    img = img.copy()
    ImageDraw.Draw(img).rectangle((x0, y0, x1, y1), (125, 123, 114))
    return img


def images(channels, seed=0, size=20):
    g = np.random.default_rng(seed)
    return (np.clip(g.integers(0, 256, (size, size, channels)) * 0.6 + 40, 0, 255)).astype(np.uint8)


@pytest.mark.parametrize("channels", [3, 1])
def test_every_operation_equals_pil(channels):
    img = images(channels)
    pil = Image.fromarray(img if channels == 3 else img[..., 0])
    u = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    for index, (name, low, high) in enumerate(OPERATIONS):
        for level in (0.15, 0.8):
            v = low + (high - low) * level
            ours = rand_augment_batch(u.to(torch.uint8), torch.tensor([[index, 5]]), torch.tensor([[level, 0.0]]),
                                      torch.zeros(1, 3))[0].permute(1, 2, 0).numpy()  # op 5: identity
            expected = np.asarray(PIL_OPS[name](pil, v)).reshape(ours.shape)
            assert np.array_equal(ours, expected), (name, v, np.abs(ours.astype(int) - expected).max())


def test_cutout_equals_official():
    img = images(3, seed=1, size=24)
    u = torch.from_numpy(img).permute(2, 0, 1)[None].float()
    for frac, cx, cy in [(0.3, 0.5, 0.5), (0.9, 0.05, 0.9), (0.5, 0.99, 0.01), (0.0, 0.5, 0.5)]:
        ours = _cutout(u, torch.tensor([[frac, cx, cy]]))[0].permute(1, 2, 0).numpy().astype(np.uint8)
        v = frac * 0.5 * 24  # Cutout(img, v) with v = random() * 0.5, times the width
        expected = img if v <= 0 else np.asarray(official_cutout_abs(Image.fromarray(img), v, cx * 24, cy * 24))
        assert np.array_equal(ours, expected), (frac, cx, cy)


def test_strong_views_come_from_the_plan():
    """The first view is the single-view batch; the second is the plain second view strongly augmented;
    the same (seed, epoch) gives the same batches, another epoch other ones."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randint(0, 256, (40, 1, 8, 8), generator=g, dtype=torch.uint8),
                         torch.arange(40) % 4, classes=list("abcd"), name="toy", mean=(0.5,), std=(0.25,))
    common = dict(train=True, device="cpu", seed=3, augment=Augment(crop_padding=1, flip=True))

    def first_batch(epoch, **kw):
        loader = make_loader(data, 10, **common, **kw)
        loader.set_epoch(epoch)
        return next(iter(loader))[0]

    single, plain, strong = first_batch(1), first_batch(1, views=2), first_batch(1, views=2, strong_views=True)
    assert torch.equal(strong[:, 0], single) and torch.equal(plain[:, 0], single)
    assert not torch.equal(strong[:, 1], plain[:, 1])
    assert torch.equal(strong, first_batch(1, views=2, strong_views=True))
    assert not torch.equal(strong[:, 1], first_batch(2, views=2, strong_views=True)[:, 1])
    with pytest.raises(Exception, match="strong_views .* needs views >= 2"):
        make_loader(data, 10, **common, strong_views=True)


# --- the MLKD loss ------------------------------------------------------------------------------

def official_mlkd(s_w, s_s, t_w, t_s, target, temperature, ce_w, kd_w, logit_stand):
    """sunshangquan/logit-standardization-KD @ f6e5aa5172bad618e801163c3385322eea673754,
    mdistiller/distillers/MLKD.py, MLKD.forward_train after the forward passes (= Jin-Ying's
    KD_ours.forward_train when logit_stand is False), its five-term sums written as loops over the
    official temperature lists, each loop keeping the official view and mask."""
    def kd_loss(a, b, t):
        a = official_normalize(a) if logit_stand else a
        b = official_normalize(b) if logit_stand else b
        return F.kl_div(F.log_softmax(a / t, dim=1), F.softmax(b / t, dim=1), reduction="none").sum(1).mean() * t**2

    pred_teacher_weak = F.softmax(t_w.detach(), dim=1)
    confidence, _ = pred_teacher_weak.max(dim=1)
    mask = confidence.le(np.percentile(confidence.cpu().numpy().flatten(), 50)).bool()
    class_confidence = torch.sum(pred_teacher_weak, dim=0)
    class_conf_mask = class_confidence.le(np.percentile(class_confidence.cpu().numpy().flatten(), 50)).bool()
    temps = [temperature, 3.0, 5.0, 2.0, 6.0]
    loss_ce = ce_w * (F.cross_entropy(s_w, target) + F.cross_entropy(s_s, target))
    loss_kd_weak = sum(kd_w * ((kd_loss(s_w, t_w, t) * mask).mean()) for t in temps)
    loss_kd_strong = (sum(kd_w * kd_loss(s_s, t_s, t) for t in temps[:3])
                      + sum(kd_w * kd_loss(s_w, t_w, t) for t in temps[3:]))
    loss_cc_weak = sum(kd_w * ((official_cc(s_w, t_w, t) * class_conf_mask).mean()) for t in temps)
    loss_bc_weak = sum(kd_w * ((official_bc(s_w, t_w, t) * mask).mean()) for t in temps)
    return loss_ce + loss_kd_weak + loss_kd_strong + loss_cc_weak + loss_bc_weak


@pytest.mark.parametrize("section", [{}, {"logit_standardization": True, "temperature": 2.0, "kd_weight": 9.0}])
def test_mlkd_equals_official(section):
    torch.manual_seed(0)
    k = 6
    student = create_model("mlp", k, in_channels=1, input_size=3, hidden=(12,)).double()
    teacher = FrozenTeacher(create_model("mlp", k, in_channels=1, input_size=3, hidden=(16,)).double())
    m = build_method(method_config({"name": "mlkd", **section}), student, num_classes=k, teacher=teacher).double()
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(12, 2, 1, 3, 3, generator=g, dtype=torch.float64), torch.randint(0, k, (12,), generator=g)
    out = m(x, y)
    t_w, t_s = (m.teacher_logits(x[:, v]).double() for v in (0, 1))
    cfg = m.config
    reference = official_mlkd(m.student(x[:, 0]), m.student(x[:, 1]), t_w, t_s, y, cfg.temperature,
                              cfg.ce_weight, cfg.kd_weight, cfg.logit_standardization)
    torch.testing.assert_close(out["loss"], reference, rtol=1e-6, atol=1e-9)
    params = list(m.parameters())
    for a, b in zip(torch.autograd.grad(out["loss"], params), torch.autograd.grad(reference, params)):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6 * b.abs().max().item())
    assert torch.equal(out["logits"], m.student(x[:, 0]))
