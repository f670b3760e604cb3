"""kdcollapse's Trainer in lockstep with the official DHKD (gradient alignment) and IKL-KD training loops.

DHKD transcribes penghui-yang/DHKD at commit 7976c69d408e72b4203d04a6e82dc27792ec1469: ``train_student.py``
(the epoch loop, ``adjust_learning_rate`` per epoch from 1, SGD over the dual-head student, ``OptimGradAlign``
with ``--ga``), ``helper/loops.py`` (``train_distill`` with ``--distill dhkd``: ``gamma·CE(logit_s[0], y)``
and ``alpha·BinaryKLNorm(logit_s[1], logit_t)``), ``helper/optimizer.py`` (``OptimGradAlign``) and
``distiller_zoo/BinaryKLNorm.py``; kdcollapse runs ``dhkd`` with ``alignment: global`` and
``binary_kl_form: official`` (the clamped form). IKL-KD transcribes jiequancui/DKL at commit
c5e8ad2e24ec53f3682a68db99de372fc80f59ca, ``DKLv1/KD-dkl/mdistiller/engine/trainer.py`` (``train``,
``train_epoch`` with the class prior accumulated from the teacher's ``softmax(z_t / T2)`` and row-normalised
at the epoch's end, ``train_iter``) and ``mdistiller/distillers/IKL_KD.py`` (``dkl_loss``, ``IKL_KD``) with
global information on (``GI: True``, the ImageNet configs' setting, which kdcollapse always uses). Only the
CUDA bindings and the logging are left out. Same weights and batches (tests/lockstep.py), 4 epochs of 4
steps, lr ×0.1 after epochs 2 and 3, IKL's warm-up ``WARMUP`` 2; compared after every step in float64.
"""

import copy

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn, optim
from torch.nn import KLDivLoss

from lockstep import MLP_STUDENT, OfficialStudent, OfficialTeacher, assert_lockstep, float64, run_trainer
from test_lockstep_mdistiller import Distiller, SCHEDULE, SOLVER, adjust_learning_rate, student_name


# ----------------------------------------------------------------------------------- DHKD, transcribed
class OptimGradAlign:
    def __init__(self, optimizer):
        self._optim = optimizer
        self.projected = []  # (added for the test) whether each step projected G_BKL

    def zero_grad(self):
        return self._optim.zero_grad(set_to_none=True)

    def step(self):
        return self._optim.step()

    def ga_backward(self, objectives):
        grads, shapes, has_grads = self._pack_grad(objectives)
        pc_grad = self._project_conflicting(grads, has_grads)
        pc_grad = self._unflatten_grad(pc_grad, shapes[0])
        self._set_grad(pc_grad)

    def _project_conflicting(self, grads, has_grads, shapes=None):
        shared = torch.stack(has_grads).prod(0).bool()
        pc_grad, num_task = copy.deepcopy(grads), len(grads)
        for g_i in pc_grad:
            g_i_g_j = torch.dot(g_i, grads[0])
            if g_i_g_j < 0:
                g_i -= (g_i_g_j) * grads[0] / (grads[0].norm() ** 2)
        self.projected.append(bool(torch.dot(grads[1], grads[0]) < 0))
        merged_grad = torch.zeros_like(grads[0]).to(grads[0].device)
        merged_grad[shared] = torch.stack([g[shared] for g in pc_grad]).sum(dim=0)
        merged_grad[~shared] = torch.stack([g[~shared] for g in pc_grad]).sum(dim=0)
        return merged_grad

    def _set_grad(self, grads):
        idx = 0
        for group in self._optim.param_groups:
            for p in group["params"]:
                p.grad = grads[idx]
                idx += 1

    def _pack_grad(self, objectives):
        grads, shapes, has_grads = [], [], []
        for obj in objectives:
            self._optim.zero_grad(set_to_none=True)
            obj.backward(retain_graph=True)
            grad, shape, has_grad = self._retrieve_grad()
            grads.append(self._flatten_grad(grad, shape))
            has_grads.append(self._flatten_grad(has_grad, shape))
            shapes.append(shape)
        return grads, shapes, has_grads

    def _unflatten_grad(self, grads, shapes):
        unflatten_grad, idx = [], 0
        for shape in shapes:
            length = np.prod(shape)
            unflatten_grad.append(grads[idx:idx + length].view(shape).clone())
            idx += length
        return unflatten_grad

    def _flatten_grad(self, grads, shapes):
        return torch.cat([g.flatten() for g in grads])

    def _retrieve_grad(self):
        grad, shape, has_grad = [], [], []
        for group in self._optim.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    shape.append(p.shape)
                    grad.append(torch.zeros_like(p).to(p.device))
                    has_grad.append(torch.zeros_like(p).to(p.device))
                    continue
                shape.append(p.grad.shape)
                grad.append(p.grad.clone())
                has_grad.append(torch.ones_like(p).to(p.device))
        return grad, shape, has_grad


class BinaryKLNorm(nn.Module):
    def __init__(self, temperature=2, eps=1e-8):
        super().__init__()
        self.eps = eps
        self.temperature = temperature
        self.criterion = KLDivLoss(reduction="none")

    def forward(self, student, teacher):
        N, _ = student.shape
        diff_st = torch.sigmoid((student - teacher) / self.temperature)
        diff_st = torch.clamp(diff_st, min=self.eps, max=1 - self.eps)
        target = torch.full_like(diff_st, 0.5)
        loss = self.criterion(torch.log(diff_st), target) + self.criterion(torch.log(1 - diff_st), 1 - target)
        return self.temperature ** 2 * loss.sum() / N


class DualHeadStudent(nn.Module):
    """The official models' ``dual_head=True`` output ``[g(f(x)), g'(f(x))]``, built from kdcollapse's student
    and auxiliary head (weights copied)."""

    def __init__(self, student, aux_head):
        super().__init__()
        self.student, self.aux_head = student, aux_head

    def forward(self, x):
        h = self.student.forward_features(x)
        return [self.student.forward_head(h), self.aux_head(h)]


def dhkd_official(model_s, model_t, batches, gamma=1.0, alpha=1.0, temperature=2.0, epochs=4, lr=0.05):
    """train_student.py's main loop (CIFAR, --dual_head --ga --distill dhkd) over the recorded batches."""
    args = {"learning_rate": lr, "lr_decay_epochs": [2, 3], "lr_decay_rate": 0.1}
    optimizer = OptimGradAlign(optim.SGD(model_s.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4))
    criterion_cls, criterion_kd = nn.CrossEntropyLoss(), BinaryKLNorm(temperature)
    lrs, parts, states = [], [], []
    for epoch in range(1, epochs + 1):
        steps = np.sum(epoch > np.asarray(args["lr_decay_epochs"]))  # helper/util.adjust_learning_rate
        if steps > 0:
            for param_group in optimizer._optim.param_groups:
                param_group["lr"] = args["learning_rate"] * (args["lr_decay_rate"] ** steps)
        model_s.train()
        for inputs, target, _ in (b for b in batches if b[2] + 1 == epoch):
            logit_s = model_s(inputs)
            with torch.no_grad():
                logit_t = model_t(inputs)
            loss_cls = criterion_cls(logit_s[0], target)
            loss_kd = criterion_kd(logit_s[1], logit_t)
            optimizer.zero_grad()
            loss_lst = [gamma * loss_cls, alpha * loss_kd]
            optimizer.ga_backward(loss_lst)
            lrs.append(optimizer._optim.param_groups[0]["lr"])
            optimizer.step()
            parts.append({"ce": float(loss_lst[0]), "bkl": float(loss_lst[1])})
            states.append({k: v.detach().clone() for k, v in model_s.state_dict().items()})
    return optimizer, lrs, parts, states


def test_dhkd_with_gradient_alignment_steps_with_the_official_loop(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=dhkd", "method.alpha=1", "method.temperature=2",
                                               "method.ce_weight=1", "method.aux_head=linear",
                                               "method.alignment=global", "method.binary_kl_form=official",
                                               *SCHEDULE, *MLP_STUDENT], teacher="resnet8")
    model_s = DualHeadStudent(copy.deepcopy(ours.initial.student), copy.deepcopy(ours.initial.aux_head))
    teacher = OfficialTeacher(ours.trainer.teacher)
    optimizer, lrs, parts, states = dhkd_official(model_s, lambda x: teacher(x)[0], ours.batches)
    assert any(optimizer.projected) and not all(optimizer.projected)  # both branches of the alignment ran
    assert_lockstep(ours, lrs, parts, states, {"ce": "ce", "binary_kl_norm": "bkl"})


# --------------------------------------------------------------------------------- IKL-KD, transcribed
def dkl_loss(logits_student, logits_teacher, temperature, alpha, beta, CLASS_PRIOR=None, GI=False, T2=100.0):
    _, NUM_CLASSES = logits_student.shape
    delta_n = logits_teacher.view(-1, NUM_CLASSES, 1) - logits_teacher.view(-1, 1, NUM_CLASSES)
    delta_a = logits_student.view(-1, NUM_CLASSES, 1) - logits_student.view(-1, 1, NUM_CLASSES)
    if GI:
        assert CLASS_PRIOR is not None, "CLASS_PRIOR information should be collected"
        with torch.no_grad():
            p_n = CLASS_PRIOR.view(-1, NUM_CLASSES, 1) @ CLASS_PRIOR.view(-1, 1, NUM_CLASSES)
    else:
        s_n = F.softmax(logits_teacher / T2, dim=1)
        p_n = s_n.view(-1, NUM_CLASSES, 1) @ s_n.view(-1, 1, NUM_CLASSES)
    loss_mse = 0.25 * (torch.pow(delta_n - delta_a, 2) * p_n).sum() / logits_student.size(0)
    loss_sce = -(F.softmax(logits_teacher / temperature, dim=-1).detach()
                 * F.log_softmax(logits_student / temperature, dim=-1)).sum(1).mean()
    return beta * loss_mse + alpha * loss_sce


class IKL_KD(Distiller):
    def __init__(self, student, teacher, ce_weight=1.0, num_classes=10, temperature=4.0, warmup=2, alpha=1.0,
                 beta=8.0, temperature2=1.0, GI=True):
        super().__init__(student, teacher)
        self.ce_loss_weight, self.num_classes, self.temperature, self.warmup = ce_weight, num_classes, temperature, warmup
        self.alpha, self.beta, self.temperature2, self.GI = alpha, beta, temperature2, GI

    def forward_train(self, image, target, **kwargs):
        logits_student, _ = self.student(image)
        with torch.no_grad():
            logits_teacher, _ = self.teacher(image)
        loss_ce = self.ce_loss_weight * F.cross_entropy(logits_student, target)
        prior = kwargs["prior"]
        onehot = F.one_hot(target, logits_student.size(-1)).to(prior.dtype)  # official: .float(), float32 there
        CLASS_PRIOR = onehot @ prior
        loss_dkl = min(kwargs["epoch"] / self.warmup, 1.0) * dkl_loss(
            logits_student, logits_teacher, self.temperature, self.alpha, self.beta, CLASS_PRIOR, self.GI,
            self.temperature2)
        return logits_student, {"loss_ce": loss_ce, "loss_kd": loss_dkl}, logits_teacher.clone().detach() / self.temperature2


def ikl_official(distiller, batches, cfg, num_classes):
    """DKL's BaseTrainer.train / train_epoch / train_iter for IKL_KD (one device: prior_gpus = prior)."""
    optimizer = optim.SGD(distiller.get_learnable_parameters(), lr=cfg["LR"], momentum=cfg["MOMENTUM"],
                          weight_decay=cfg["WEIGHT_DECAY"])
    lrs, parts, states, prior = [], [], [], None
    for epoch in range(1, cfg["EPOCHS"] + 1):
        adjust_learning_rate(epoch, cfg, optimizer)
        distiller.train()
        PRIOR = torch.zeros(num_classes, num_classes)
        prior = prior if prior is not None else torch.ones(num_classes, num_classes) / num_classes
        for image, target, _ in (b for b in batches if b[2] + 1 == epoch):
            optimizer.zero_grad()
            preds, losses_dict, teacher_feat = distiller(image=image, target=target, epoch=epoch, prior=prior)
            loss = sum([l.mean() for l in losses_dict.values()])
            loss.backward()
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            onehot = F.one_hot(target, num_classes).to(PRIOR.dtype)  # official: .float(), float32 there
            PRIOR = PRIOR + (onehot.t() @ F.softmax(teacher_feat, dim=-1))
            parts.append({k: float(v.detach()) for k, v in losses_dict.items()})
            states.append({k: v.detach().clone() for k, v in distiller.state_dict().items()})
        prior = PRIOR / PRIOR.sum(1, keepdim=True)
    return lrs, parts, states


def test_ikl_kd_steps_with_dkls_loop_and_its_class_prior(tmp_path, monkeypatch):
    ours = run_trainer(tmp_path, monkeypatch, ["method.name=ikl_kd", "method.mse_weight=8", "method.soft_ce_weight=1",
                                               "method.temperature=4", "method.weight_temperature=2",
                                               "method.warmup_epochs=2", *SCHEDULE, *MLP_STUDENT],
                       teacher="resnet8", classes=10)
    official = IKL_KD(OfficialStudent(copy.deepcopy(ours.initial.student)), OfficialTeacher(ours.trainer.teacher),
                      temperature2=2.0)
    with float64():
        lrs, parts, states = ikl_official(official, ours.batches, SOLVER, 10)
    # Epoch 1 (uniform prior) agrees to float64 rounding; from epoch 2 the class-mean table enters, which
    # kdcollapse computes from float32 softmax(z_t / T2) (as the official code does on its float32 GPU run):
    # agreement to float32 rounding of the table, 2e-9 relative in the loss here.
    assert_lockstep(ours, lrs[:4], parts[:4], states[:4], {"ce": "loss_ce", "ikl": "loss_kd"}, student_name,
                    trajectory_steps=4)
    assert_lockstep(ours, lrs, parts, states, {"ce": "loss_ce", "ikl": "loss_kd"}, student_name, rtol=1e-6,
                    atol=1e-8)
