"""Distillation losses: pure functions of tensors, each with a thin ``nn.Module`` wrapper.

Logit losses take (B, K) or (B, T, K) logits and an optional (B, T) bool or 0/1 ``mask``; every
kept position (mask set, label not ``ignore_index``) is one sample. Half-precision inputs accumulate
in float32. Bad input (shapes, dtypes, NaN/inf, labels out of range) raises
:class:`kdcollapse.errors.KdcollapseError`; ``validation(False)`` turns the value checks off.
Formulas, options and references: ``docs/losses.md``. Every loss is declared once with
:func:`register_loss` (name, kind, paper, options, a test example); :func:`list_losses` and
:func:`get_loss` read the declarations, and the contract tests are parametrised over them.
"""

from kdcollapse.losses._catalog import (KINDS, LossCase, LossInfo, class_table, example_tensors, get_loss, list_losses,
                                       register_loss)
from kdcollapse.losses._module import LossModule, loss_module
from kdcollapse.losses._reduce import IGNORE_INDEX, slice_vocab, validation
from kdcollapse.losses.abkd import abkd_loss
from kdcollapse.losses.akl import akl_loss
from kdcollapse.losses.distillm2 import distillm2_fused_loss, distillm2_loss, distillm2_student_kl_loss
from kdcollapse.losses.adversarial import ikl_at_loss, trades_loss
from kdcollapse.losses.binary_kl import binary_kl_loss, binary_kl_norm_loss
from kdcollapse.losses.contrastive import intra_class_contrastive_loss
from kdcollapse.losses.cosine import within_class_cosine_distance
from kdcollapse.losses.crd import crd_log_scores, crd_loss, crd_memory_update, crd_nce_loss, crd_normalizer
from kdcollapse.losses.dkd import dkd_loss
from kdcollapse.losses.dkl import dkl_loss, ikl_loss
from kdcollapse.losses.fused import TeacherHead, TeacherLogits, TopKTeacher, fused_head_loss
from kdcollapse.losses.kd import kd_loss
from kdcollapse.losses.llm import (CausalLMBatch, forward_kl_loss, jsd_loss, reverse_kl_loss,
                                  shift_for_causal_lm, skew_forward_kl_loss, skew_reverse_kl_loss, tvd_loss)
from kdcollapse.losses.reviewkd import hcl_loss
from kdcollapse.losses.rkd import rkd_loss
from kdcollapse.losses.standardize import standardize_logits
from kdcollapse.losses.nkd import nkd_loss
from kdcollapse.losses.wttm import wttm_loss
from kdcollapse.losses.mlkd import batch_correlation_loss, class_correlation_loss
from kdcollapse.losses.vid import match_spatial_size, vid_initial_log_scale, vid_loss
from kdcollapse.losses.attention import at_loss, attention_map
from kdcollapse.losses.dist import dist_loss, pearson_correlation
from kdcollapse.losses.fitnet import fitnet_loss
from kdcollapse.losses.srd import srd_loss
from kdcollapse.losses.ofd import ofd_loss, ofd_margin
from kdcollapse.losses.nst import nst_loss
from kdcollapse.losses.similarity import pkt_loss, sp_loss

KDLoss = loss_module("KDLoss", kd_loss)
DKDLoss = loss_module("DKDLoss", dkd_loss)
BinaryKLLoss = loss_module("BinaryKLLoss", binary_kl_loss)
BinaryKLNormLoss = loss_module("BinaryKLNormLoss", binary_kl_norm_loss)
DKLLoss = loss_module("DKLLoss", dkl_loss)
IKLLoss = loss_module("IKLLoss", ikl_loss)
IntraClassContrastiveLoss = loss_module("IntraClassContrastiveLoss", intra_class_contrastive_loss)
RKDLoss = loss_module("RKDLoss", rkd_loss)
TRADESLoss = loss_module("TRADESLoss", trades_loss)
IKLATLoss = loss_module("IKLATLoss", ikl_at_loss)
NKDLoss = loss_module("NKDLoss", nkd_loss)
WTTMLoss = loss_module("WTTMLoss", wttm_loss)
VIDLoss = loss_module("VIDLoss", vid_loss)
ATLoss = loss_module("ATLoss", at_loss)  # the other feature losses have no hyperparameters to store
DISTLoss = loss_module("DISTLoss", dist_loss)
ForwardKLLoss = loss_module("ForwardKLLoss", forward_kl_loss)
ReverseKLLoss = loss_module("ReverseKLLoss", reverse_kl_loss)
JSDLoss = loss_module("JSDLoss", jsd_loss)
SkewForwardKLLoss = loss_module("SkewForwardKLLoss", skew_forward_kl_loss)
SkewReverseKLLoss = loss_module("SkewReverseKLLoss", skew_reverse_kl_loss)
TVDLoss = loss_module("TVDLoss", tvd_loss)
AKLLoss = loss_module("AKLLoss", akl_loss)
ABKDLoss = loss_module("ABKDLoss", abkd_loss)

__all__ = [
    "kd_loss", "dkd_loss", "binary_kl_loss", "binary_kl_norm_loss", "dkl_loss", "ikl_loss",
    "intra_class_contrastive_loss", "within_class_cosine_distance", "rkd_loss", "trades_loss", "ikl_at_loss",
    "KDLoss", "DKDLoss", "BinaryKLLoss", "BinaryKLNormLoss", "DKLLoss", "IKLLoss",
    "IntraClassContrastiveLoss", "RKDLoss", "TRADESLoss", "IKLATLoss", "LossModule", "loss_module",
    "IGNORE_INDEX", "validation", "slice_vocab", "shift_for_causal_lm", "CausalLMBatch",
    "forward_kl_loss", "reverse_kl_loss", "jsd_loss",
    "skew_forward_kl_loss", "skew_reverse_kl_loss", "tvd_loss", "ForwardKLLoss", "ReverseKLLoss", "JSDLoss",
    "SkewForwardKLLoss", "SkewReverseKLLoss", "TVDLoss", "fused_head_loss", "TeacherLogits", "TeacherHead",
    "TopKTeacher", "akl_loss", "AKLLoss", "abkd_loss", "ABKDLoss",
    "distillm2_loss", "distillm2_fused_loss", "distillm2_student_kl_loss",
    "register_loss", "get_loss", "list_losses", "LossInfo", "LossCase", "KINDS", "class_table", "example_tensors",
    "standardize_logits", "nkd_loss", "wttm_loss", "class_correlation_loss", "batch_correlation_loss",
    "NKDLoss", "WTTMLoss",
    "crd_loss", "crd_nce_loss", "crd_log_scores", "crd_normalizer", "crd_memory_update", "hcl_loss", "vid_loss",
    "vid_initial_log_scale", "match_spatial_size", "VIDLoss",
    "fitnet_loss", "srd_loss", "at_loss", "attention_map", "ofd_loss", "ofd_margin", "dist_loss", "pearson_correlation",
    "nst_loss", "sp_loss", "pkt_loss", "ATLoss", "DISTLoss",
]
