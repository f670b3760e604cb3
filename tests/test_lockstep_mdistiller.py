"""kdcollapse's Trainer in lockstep with mdistiller's training loop: KD, DKD and FitNet.

The official loop transcribes megvii-research/mdistiller at commit a08d46f10d6102bd6e3f258ca5ac880b020ea259:
``tools/train.py`` (the distiller wrapped, ``BaseTrainer(...).train()``), ``mdistiller/engine/trainer.py``
(``BaseTrainer.init_optimizer``, ``train``, ``train_epoch``, ``train_iter``), ``mdistiller/engine/utils.py``
(``adjust_learning_rate``), ``mdistiller/distillers/_base.py`` (``Distiller``), ``KD.py``, ``DKD.py``,
``FitNet.py`` and ``_common.py`` (``ConvReg``). Only the CUDA bindings (``.cuda()``, ``DataParallel``) and
the logging are left out. Both sides start from the same weights, see the same batches (tests/lockstep.py)
and run 4 epochs of 4 steps with the learning rate ×0.1 after epochs 2 and 3 (mdistiller's
``LR_DECAY_STAGES`` [2, 3]: two milestones) and DKD's warm-up ``WARMUP`` 2 (its end inside the run).
Compared after every step: learning rate, each logged loss part, every parameter and buffer.
"""

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from lockstep import MLP_STUDENT, OfficialStudent, OfficialTeacher, assert_lockstep, float64, run_trainer

SOLVER = {"LR": 0.05, "LR_DECAY_STAGES": [2, 3], "LR_DECAY_RATE": 0.1, "WEIGHT_DECAY": 5e-4, "MOMENTUM": 0.9,
          "EPOCHS": 4}
SCHEDULE = ["optim.lr=0.05", "optim.momentum=0.9", "optim.weight_decay=5e-4", "schedule.name=multistep",
            "schedule.milestones=[2, 3]", "schedule.gamma=0.1", "train.epochs=4"]


# ----------------------------------------------------------------------- transcribed official code
def adjust_learning_rate(epoch, cfg, optimizer):
    steps = np.sum(epoch > np.asarray(cfg["LR_DECAY_STAGES"]))
    if steps > 0:
        new_lr = cfg["LR"] * (cfg["LR_DECAY_RATE"] ** steps)
        for param_group in optimizer.param_groups:
            param_group["lr"] = new_lr
        return new_lr
    return cfg["LR"]


class Distiller(nn.Module):
    def __init__(self, student, teacher):
        super().__init__()
        self.student = student
        self.teacher = teacher

    def train(self, mode=True):
        self.training = mode
        for module in self.children():
            module.train(mode)
        self.teacher.eval()
        return self

    def get_learnable_parameters(self):
        return [v for k, v in self.student.named_parameters()]

    def forward(self, **kwargs):
        return self.forward_train(**kwargs)


def kd_loss(logits_student, logits_teacher, temperature):
    log_pred_student = F.log_softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    loss_kd = F.kl_div(log_pred_student, pred_teacher, reduction="none").sum(1).mean()
    loss_kd *= temperature**2
    return loss_kd


class KD(Distiller):
    def __init__(self, student, teacher, temperature=4, ce_weight=0.1, kd_weight=0.9):
        super().__init__(student, teacher)
        self.temperature, self.ce_loss_weight, self.kd_loss_weight = temperature, ce_weight, kd_weight

    def forward_train(self, image, target, **kwargs):
        logits_student, _ = self.student(image)
        with torch.no_grad():
            logits_teacher, _ = self.teacher(image)
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        loss_kd = self.kd_loss_weight * kd_loss(logits_student, logits_teacher, self.temperature)
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_kd}


def _get_gt_mask(logits, target):
    return torch.zeros_like(logits).scatter_(1, target.reshape(-1).unsqueeze(1), 1).bool()


def _get_other_mask(logits, target):
    return torch.ones_like(logits).scatter_(1, target.reshape(-1).unsqueeze(1), 0).bool()


def cat_mask(t, mask1, mask2):
    t1 = (t * mask1).sum(dim=1, keepdims=True)
    t2 = (t * mask2).sum(1, keepdims=True)
    return torch.cat([t1, t2], dim=1)


def dkd_loss(logits_student, logits_teacher, target, alpha, beta, temperature):
    gt_mask = _get_gt_mask(logits_student, target)
    other_mask = _get_other_mask(logits_student, target)
    pred_student = F.softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    pred_student = cat_mask(pred_student, gt_mask, other_mask)
    pred_teacher = cat_mask(pred_teacher, gt_mask, other_mask)
    log_pred_student = torch.log(pred_student)
    tckd_loss = F.kl_div(log_pred_student, pred_teacher, reduction="sum") * (temperature**2) / target.shape[0]
    pred_teacher_part2 = F.softmax(logits_teacher / temperature - 1000.0 * gt_mask, dim=1)
    log_pred_student_part2 = F.log_softmax(logits_student / temperature - 1000.0 * gt_mask, dim=1)
    nckd_loss = F.kl_div(log_pred_student_part2, pred_teacher_part2, reduction="sum") * (temperature**2) \
        / target.shape[0]
    return alpha * tckd_loss + beta * nckd_loss


class DKD(Distiller):
    def __init__(self, student, teacher, ce_weight=1.0, alpha=1.0, beta=8.0, temperature=4.0, warmup=20):
        super().__init__(student, teacher)
        self.ce_loss_weight, self.alpha, self.beta = ce_weight, alpha, beta
        self.temperature, self.warmup = temperature, warmup

    def forward_train(self, image, target, **kwargs):
        logits_student, _ = self.student(image)
        with torch.no_grad():
            logits_teacher, _ = self.teacher(image)
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        loss_dkd = min(kwargs["epoch"] / self.warmup, 1.0) * dkd_loss(
            logits_student, logits_teacher, target, self.alpha, self.beta, self.temperature)
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_dkd}


class ConvReg(nn.Module):
    def __init__(self, s_shape, t_shape, use_relu=True):
        super().__init__()
        self.use_relu = use_relu
        s_N, s_C, s_H, s_W = s_shape
        t_N, t_C, t_H, t_W = t_shape
        if s_H == 2 * t_H:
            self.conv = nn.Conv2d(s_C, t_C, kernel_size=3, stride=2, padding=1)
        elif s_H * 2 == t_H:
            self.conv = nn.ConvTranspose2d(s_C, t_C, kernel_size=4, stride=2, padding=1)
        elif s_H >= t_H:
            self.conv = nn.Conv2d(s_C, t_C, kernel_size=(1 + s_H - t_H, 1 + s_W - t_W))
        self.bn = nn.BatchNorm2d(t_C)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        x = self.conv(x)
        return self.relu(self.bn(x)) if self.use_relu else self.bn(x)


def get_feat_shapes(student, teacher, input_size):
    data = torch.randn(1, 3, *input_size)
    with torch.no_grad():
        _, feat_s = student(data)
        _, feat_t = teacher(data)
    return [f.shape for f in feat_s["feats"]], [f.shape for f in feat_t["feats"]]


class FitNet(Distiller):
    def __init__(self, student, teacher, ce_weight=1.0, feat_weight=100.0, hint_layer=2, input_size=(32, 32)):
        super().__init__(student, teacher)
        self.ce_loss_weight, self.feat_loss_weight, self.hint_layer = ce_weight, feat_weight, hint_layer
        feat_s_shapes, feat_t_shapes = get_feat_shapes(self.student, self.teacher, input_size)
        self.conv_reg = ConvReg(feat_s_shapes[self.hint_layer], feat_t_shapes[self.hint_layer])

    def get_learnable_parameters(self):
        return super().get_learnable_parameters() + list(self.conv_reg.parameters())

    def forward_train(self, image, target, **kwargs):
        logits_student, feature_student = self.student(image)
        with torch.no_grad():
            _, feature_teacher = self.teacher(image)
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        f_s = self.conv_reg(feature_student["feats"][self.hint_layer])
        loss_feat = self.feat_loss_weight * F.mse_loss(f_s, feature_teacher["feats"][self.hint_layer])
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_feat}


def official_train(distiller, batches, cfg):
    """BaseTrainer.train -> train_epoch -> train_iter, on the recorded batches (epoch counted from 1)."""
    optimizer = optim.SGD(distiller.get_learnable_parameters(), lr=cfg["LR"], momentum=cfg["MOMENTUM"],
                          weight_decay=cfg["WEIGHT_DECAY"])
    lrs, parts, states = [], [], []
    for epoch in range(1, cfg["EPOCHS"] + 1):
        adjust_learning_rate(epoch, cfg, optimizer)
        distiller.train()
        for image, target, ours_epoch in (b for b in batches if b[2] + 1 == epoch):
            optimizer.zero_grad()
            preds, losses_dict = distiller(image=image, target=target, epoch=epoch)
            loss = sum([l.mean() for l in losses_dict.values()])
            loss.backward()
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            parts.append({k: float(v.detach()) for k, v in losses_dict.items()})
            states.append({k: v.detach().clone() for k, v in distiller.state_dict().items()})
    return lrs, parts, states


def student_name(name):
    """Our method's state-dict names -> the official distiller's (the student inside OfficialStudent)."""
    return "student.model." + name.removeprefix("student.") if name.startswith("student.") else name


# --------------------------------------------------------------------------------------------- tests
def test_kd_steps_with_mdistillers_loop(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=kd", "method.temperature=4", "method.ce_weight=0.1",
                                               "method.kd_weight=0.9", *SCHEDULE, *MLP_STUDENT], teacher="resnet8")
    assert len(ours.lrs) == 16 and np.allclose(sorted(set(ours.lrs), reverse=True), [0.05, 0.005, 0.0005])
    official = KD(OfficialStudent(copy.deepcopy(ours.initial.student)), OfficialTeacher(ours.trainer.teacher))
    assert_lockstep(ours, *official_train(official, ours.batches, SOLVER), {"ce": "loss_ce", "kd": "loss_kd"},
                    student_name)


def test_dkd_steps_with_mdistillers_loop_through_its_warmup(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=dkd", "method.beta=8", "method.warmup_epochs=2",
                                               *SCHEDULE, *MLP_STUDENT], teacher="resnet8")
    official = DKD(OfficialStudent(copy.deepcopy(ours.initial.student)), OfficialTeacher(ours.trainer.teacher),
                   warmup=2)
    lrs, parts, states = official_train(official, ours.batches, SOLVER)
    assert_lockstep(ours, lrs, parts, states, {"ce": "loss_ce", "dkd": "loss_kd"}, student_name)


def test_fitnet_steps_with_mdistillers_loop(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=fitnet", "method.student_stage=2", "method.teacher_stage=2",
                                               *SCHEDULE, "model.name=resnet8"], teacher="resnet14", per_batch=4,
                       batch_size=8)
    with float64():
        official = FitNet(OfficialStudent(copy.deepcopy(ours.initial.student)), OfficialTeacher(ours.trainer.teacher))
    # FitNet.__init__ ran one noise batch through the student in train mode (get_feat_shapes), which moved its
    # BN running statistics: a deliberate deviation (test below); undone here so both start equal.
    official.student.model.load_state_dict(ours.initial.student.state_dict())
    official.conv_reg.load_state_dict(ours.initial.regressor.state_dict())
    lrs, parts, states = official_train(official, ours.batches, SOLVER)
    # kdcollapse's FitNet casts the regressor's output to float32 before the loss (its bf16 path), so the
    # comparison is at float32 precision.
    assert_lockstep(ours, lrs, parts, states, {"ce": "loss_ce", "hint": "loss_kd"},
                    lambda n: "conv_reg." + n.removeprefix("regressor.") if n.startswith("regressor.") else
                    student_name(n), rtol=2e-5, atol=1e-6)


def test_mdistillers_fitnet_init_moves_the_teachers_bn_statistics(tmp_path):
    """Deliberate deviation, measured: mdistiller's FitNet (and VID) ``__init__`` calls ``get_feat_shapes``,
    which runs one N(0, 1) image through student and teacher under ``no_grad`` but in train mode (tools/train.py
    builds both in train mode and ``Distiller.train`` switches the teacher to eval only later), so every BN
    running statistic moves 10 % (momentum 0.1) towards that noise image's statistics, and the teacher keeps
    them for the whole run. kdcollapse's teacher is frozen in eval mode from the start and never moves.
    Measured here on an untrained resnet14 with non-trivial statistics (running mean ~N(0, 0.1), variance in
    [0.5, 1.5]): its logits on 64 N(0, 1) images change by 22 % (relative norm), 1 of 64 predictions flips;
    the effect on a trained teacher's accuracy is not measured here (no CIFAR teacher on this machine)."""
    from kdcollapse.models import create_model
    from safetensors.torch import load_file

    from lockstep import write_teacher

    torch.manual_seed(0)
    teacher = create_model("resnet14", 100, in_channels=3)
    teacher.load_state_dict(load_file(str(write_teacher(tmp_path / "t.safetensors", "resnet14"))))
    before = copy.deepcopy(teacher).eval()
    student = create_model("resnet8", 100, in_channels=3)
    FitNet(OfficialStudent(student), OfficialStudent(teacher))  # what tools/train.py does, in train mode
    teacher.eval()
    x = torch.randn(64, 3, 32, 32)
    with torch.no_grad():
        change = (teacher(x) - before(x)).norm() / before(x).norm()
    moved = [(a - b).abs().max() for a, b in zip(teacher.state_dict().values(), before.state_dict().values())
             if a.is_floating_point()]
    assert max(moved) > 1e-3 and change > 0.01  # the official init changes the teacher kdcollapse would use
