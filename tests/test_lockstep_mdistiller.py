"""kdcollapse's Trainer in lockstep with mdistiller's training loop: KD, DKD, FitNet, ReviewKD and CRD.

The official loop transcribes megvii-research/mdistiller at commit a08d46f10d6102bd6e3f258ca5ac880b020ea259:
``tools/train.py`` (the distiller wrapped, ``BaseTrainer(...).train()``), ``mdistiller/engine/trainer.py``
(``BaseTrainer.init_optimizer``, ``train``, ``train_epoch``, ``train_iter``), ``mdistiller/engine/utils.py``
(``adjust_learning_rate``), ``mdistiller/distillers/_base.py`` (``Distiller``), ``KD.py``, ``DKD.py``,
``FitNet.py``, ``_common.py`` (``ConvReg``), ``ReviewKD.py`` and ``CRD.py`` (with ``CRDTrainer.train_iter``).
Only the CUDA bindings (``.cuda()``, ``DataParallel``, CRD's AliasMethod sampler) and the logging are left out. Both sides start from the same weights, see the same batches (tests/lockstep.py)
and run 4 epochs of 4 steps with the learning rate ×0.1 after epochs 2 and 3 (mdistiller's
``LR_DECAY_STAGES`` [2, 3]: two milestones) and DKD's warm-up ``WARMUP`` 2 (its end inside the run).
Compared after every step: learning rate, each logged loss part, every parameter and buffer.
"""

import copy
import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim

from lockstep import MLP_STUDENT, OfficialStudent, OfficialTeacher, assert_lockstep, float64, run_trainer
from test_feature_methods_official import OfficialABF
from test_losses_contrastive_features import official_hcl

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


class ReviewKD(Distiller):
    """mdistiller's ReviewKD.forward_train; ABF is ``OfficialABF`` (tests/test_feature_methods_official.py) and
    hcl_loss ``official_hcl`` (tests/test_losses_contrastive_features.py), both transcribed from the same file."""

    def __init__(self, student, teacher, shapes, out_shapes, in_channels, out_channels, ce_weight=1.0,
                 reviewkd_weight=1.0, warmup_epochs=20, stu_preact=False):
        super().__init__(student, teacher)
        self.shapes, self.out_shapes = shapes, out_shapes
        self.ce_loss_weight, self.reviewkd_loss_weight = ce_weight, reviewkd_weight
        self.warmup_epochs, self.stu_preact = warmup_epochs, stu_preact
        abfs = nn.ModuleList()
        mid_channel = min(512, in_channels[-1])
        for idx, in_channel in enumerate(in_channels):
            abfs.append(OfficialABF(in_channel, mid_channel, out_channels[idx], idx < len(in_channels) - 1))
        self.abfs = abfs[::-1]

    def get_learnable_parameters(self):
        return super().get_learnable_parameters() + list(self.abfs.parameters())

    def forward_train(self, image, target, **kwargs):
        logits_student, features_student = self.student(image)
        with torch.no_grad():
            logits_teacher, features_teacher = self.teacher(image)
        key = "preact_feats" if self.stu_preact else "feats"
        x = features_student[key] + [features_student["pooled_feat"].unsqueeze(-1).unsqueeze(-1)]
        x = x[::-1]
        results = []
        out_features, res_features = self.abfs[0](x[0], out_shape=self.out_shapes[0])
        results.append(out_features)
        for features, abf, shape, out_shape in zip(x[1:], self.abfs[1:], self.shapes[1:], self.out_shapes[1:]):
            out_features, res_features = abf(features, res_features, shape, out_shape)
            results.insert(0, out_features)
        features_teacher = features_teacher["preact_feats"][1:] + [
            features_teacher["pooled_feat"].unsqueeze(-1).unsqueeze(-1)]
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        loss_reviewkd = (self.reviewkd_loss_weight * min(kwargs["epoch"] / self.warmup_epochs, 1.0)
                         * official_hcl(results, features_teacher))
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_reviewkd}


class Normalize(nn.Module):
    def __init__(self, power=2):
        super().__init__()
        self.power = power

    def forward(self, x):
        norm = x.pow(self.power).sum(1, keepdim=True).pow(1.0 / self.power)
        return x.div(norm)


class Embed(nn.Module):
    def __init__(self, dim_in=1024, dim_out=128):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)
        self.l2norm = Normalize(2)

    def forward(self, x):
        x = x.reshape(x.shape[0], -1)
        return self.l2norm(self.linear(x))


class ContrastLoss(nn.Module):
    def __init__(self, num_data):
        super().__init__()
        self.num_data = num_data

    def forward(self, x):
        eps = 1e-7
        bsz = x.shape[0]
        m = x.size(1) - 1
        Pn = 1 / float(self.num_data)
        P_pos = x.select(1, 0)
        log_D1 = torch.div(P_pos, P_pos.add(m * Pn + eps)).log_()
        P_neg = x.narrow(1, 1, m)
        log_D0 = torch.div(P_neg.clone().fill_(m * Pn), P_neg.add(m * Pn + eps)).log_()
        return -(log_D1.sum(0) + log_D0.view(-1, 1).sum(0)) / bsz


class ContrastMemory(nn.Module):
    """Its AliasMethod sampler (moved to CUDA in __init__) is left out: the dataset's contrast indices are given."""

    def __init__(self, inputSize, output_size, K, T=0.07, momentum=0.5):
        super().__init__()
        self.n_lem = output_size
        self.K = K
        self.register_buffer("params", torch.tensor([K, T, -1, -1, momentum]))
        stdv = 1.0 / math.sqrt(inputSize / 3)
        self.register_buffer("memory_v1", torch.rand(output_size, inputSize).mul_(2 * stdv).add_(-stdv))
        self.register_buffer("memory_v2", torch.rand(output_size, inputSize).mul_(2 * stdv).add_(-stdv))

    def forward(self, v1, v2, y, idx=None):
        K = int(self.params[0].item())
        T = self.params[1].item()
        Z_v1 = self.params[2].item()
        Z_v2 = self.params[3].item()
        momentum = self.params[4].item()
        batchSize = v1.size(0)
        outputSize = self.memory_v1.size(0)
        inputSize = self.memory_v1.size(1)
        weight_v1 = torch.index_select(self.memory_v1, 0, idx.view(-1)).detach()
        weight_v1 = weight_v1.view(batchSize, K + 1, inputSize)
        out_v2 = torch.bmm(weight_v1, v2.view(batchSize, inputSize, 1))
        out_v2 = torch.exp(torch.div(out_v2, T))
        weight_v2 = torch.index_select(self.memory_v2, 0, idx.view(-1)).detach()
        weight_v2 = weight_v2.view(batchSize, K + 1, inputSize)
        out_v1 = torch.bmm(weight_v2, v1.view(batchSize, inputSize, 1))
        out_v1 = torch.exp(torch.div(out_v1, T))
        if Z_v1 < 0:
            self.params[2] = out_v1.mean() * outputSize
            Z_v1 = self.params[2].clone().detach().item()
        if Z_v2 < 0:
            self.params[3] = out_v2.mean() * outputSize
            Z_v2 = self.params[3].clone().detach().item()
        out_v1 = torch.div(out_v1, Z_v1).contiguous()
        out_v2 = torch.div(out_v2, Z_v2).contiguous()
        with torch.no_grad():
            l_pos = torch.index_select(self.memory_v1, 0, y.view(-1))
            l_pos.mul_(momentum)
            l_pos.add_(torch.mul(v1, 1 - momentum))
            l_norm = l_pos.pow(2).sum(1, keepdim=True).pow(0.5)
            updated_v1 = l_pos.div(l_norm)
            self.memory_v1.index_copy_(0, y, updated_v1)
            ab_pos = torch.index_select(self.memory_v2, 0, y.view(-1))
            ab_pos.mul_(momentum)
            ab_pos.add_(torch.mul(v2, 1 - momentum))
            ab_norm = ab_pos.pow(2).sum(1, keepdim=True).pow(0.5)
            updated_v2 = ab_pos.div(ab_norm)
            self.memory_v2.index_copy_(0, y, updated_v2)
        return out_v1, out_v2


class CRD(Distiller):
    def __init__(self, student, teacher, feat_s_channel, feat_t_channel, num_data, feat_dim=128, k=16384,
                 momentum=0.5, temperature=0.07, ce_weight=1.0, feat_weight=0.8):
        super().__init__(student, teacher)
        self.ce_loss_weight, self.feat_loss_weight = ce_weight, feat_weight
        self.embed_s = Embed(feat_s_channel, feat_dim)
        self.embed_t = Embed(feat_t_channel, feat_dim)
        self.contrast = ContrastMemory(feat_dim, num_data, k, temperature, momentum)
        self.criterion_s = ContrastLoss(num_data)
        self.criterion_t = ContrastLoss(num_data)

    def get_learnable_parameters(self):
        return super().get_learnable_parameters() + list(self.embed_s.parameters()) + list(self.embed_t.parameters())

    def crd_loss(self, f_s, f_t, idx, contrast_idx):
        f_s = self.embed_s(f_s)
        f_t = self.embed_t(f_t)
        out_s, out_t = self.contrast(f_s, f_t, idx, contrast_idx)
        return self.criterion_s(out_s) + self.criterion_t(out_t)

    def forward_train(self, image, target, index, contrastive_index, **kwargs):
        logits_student, feature_student = self.student(image)
        with torch.no_grad():
            _, feature_teacher = self.teacher(image)
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        loss_crd = self.feat_loss_weight * self.crd_loss(feature_student["pooled_feat"], feature_teacher["pooled_feat"],
                                                         index, contrastive_index)
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_crd}


def official_train(distiller, batches, cfg, contrast=None):
    """BaseTrainer.train -> train_epoch -> train_iter (CRDTrainer's with ``contrast``: per step the index and
    contrast indices its CIFAR100InstanceSample dataset returns), on the recorded batches, epochs from 1."""
    optimizer = optim.SGD(distiller.get_learnable_parameters(), lr=cfg["LR"], momentum=cfg["MOMENTUM"],
                          weight_decay=cfg["WEIGHT_DECAY"])
    lrs, parts, states = [], [], []
    for epoch in range(1, cfg["EPOCHS"] + 1):
        adjust_learning_rate(epoch, cfg, optimizer)
        distiller.train()
        for step, (image, target, batch_epoch) in enumerate(batches):
            if batch_epoch + 1 != epoch:
                continue
            optimizer.zero_grad()
            if contrast is None:  # BaseTrainer.train_iter
                preds, losses_dict = distiller(image=image, target=target, epoch=epoch)
            else:  # CRDTrainer.train_iter: the dataset's (index, contrastive_index)
                index, contrastive_index = contrast[step]
                preds, losses_dict = distiller(image=image, target=target, index=index,
                                               contrastive_index=contrastive_index)
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
                                               *SCHEDULE, "model.name=resnet8"], teacher="resnet14", per_batch=2,
                       batch_size=4)
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


def test_reviewkd_steps_with_mdistillers_loop_through_its_warmup(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=reviewkd", "method.reviewkd_weight=5",
                                               "method.warmup_epochs=2", *SCHEDULE, "model.name=resnet8"],
                       teacher="resnet14", per_batch=2, batch_size=4)
    # mdistiller's REVIEWKD.SHAPES / OUT_SHAPES: the map sizes of stages 1-3 and the pooled feature (1),
    # deepest (the pooled feature) first; IN_CHANNELS / OUT_CHANNELS shallow to deep.
    student, teacher = ours.initial.student, ours.trainer.teacher
    s_info = [student.feature_info[i] for i in (1, 2, 3)]
    t_info = [teacher.feature_info[i] for i in (1, 2, 3)]
    shapes = [1, *[32 // f.reduction for f in s_info][::-1]]
    out_shapes = [1, *[32 // f.reduction for f in t_info][::-1]]
    with float64():
        official = ReviewKD(OfficialStudent(copy.deepcopy(student)), OfficialTeacher(teacher), shapes, out_shapes,
                            [*(f.channels for f in s_info), student.feature_dim],
                            [*(f.channels for f in t_info), teacher.model.feature_dim], reviewkd_weight=5.0,
                            warmup_epochs=2)
    for theirs, mine in zip(official.abfs, ours.initial.fusion.blocks):
        theirs.load_state_dict(mine.state_dict())
    lrs, parts, states = official_train(official, ours.batches, SOLVER)
    rename = {"fusion.blocks.": "abfs."}
    assert_lockstep(ours, lrs, parts, states, {"ce": "loss_ce", "reviewkd": "loss_kd"},
                    lambda n: next((n.replace(a, b) for a, b in rename.items() if n.startswith(a)), None)
                    or student_name(n))


def test_crd_steps_with_mdistillers_crd_trainer(tmp_path, monkeypatch):
    """CRD's negatives are drawn by kdcollapse each step (its sampler is tested against mdistiller's
    CIFAR100InstanceSample in tests/test_methods_crd_reviewkd_vid.py); the official trainer is handed the same
    contrast indices, as its dataset would return them (positive = the sample's own index, mode exact)."""
    drawn = []

    def record(trainer):
        sample = trainer.method.sample_negatives
        trainer.method.sample_negatives = lambda y: drawn.append(sample(y)) or drawn[-1]

    ours = run_trainer(tmp_path, monkeypatch, ["method.name=crd", "method.num_negatives=8", "method.feat_dim=16",
                                               *SCHEDULE, "model.name=resnet8"], teacher="resnet14", per_batch=2,
                       batch_size=4, prepare=record)
    student, teacher = ours.initial.student, ours.trainer.teacher
    with float64():
        official = CRD(OfficialStudent(copy.deepcopy(student)), OfficialTeacher(teacher), student.feature_dim,
                       teacher.model.feature_dim, num_data=10, feat_dim=16, k=8)
    official.embed_s.load_state_dict(ours.initial.embed_student.state_dict())
    official.embed_t.load_state_dict(ours.initial.embed_teacher.state_dict())
    official.contrast.memory_v1.copy_(ours.initial.memory_student)
    official.contrast.memory_v2.copy_(ours.initial.memory_teacher)
    contrast = [(index, torch.cat([index[:, None], negatives], 1)) for index, negatives in zip(ours.indices, drawn)]
    lrs, parts, states = official_train(official, ours.batches, SOLVER, contrast)
    names = {"embed_student.": "embed_s.", "embed_teacher.": "embed_t.", "memory_student": "contrast.memory_v1",
             "memory_teacher": "contrast.memory_v2"}
    assert_lockstep(ours, lrs, parts, states, {"ce": "loss_ce", "crd": "loss_kd"},
                    lambda n: None if n == "normalizers" else next(
                        (n.replace(a, b) for a, b in names.items() if n.startswith(a)), None) or student_name(n))
    torch.testing.assert_close(ours.states[-1]["normalizers"], official.contrast.params[2:4], rtol=1e-12, atol=0)


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
