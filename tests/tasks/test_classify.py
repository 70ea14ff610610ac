"""The classification objective: its losses against timm's and DeiT's (written out), the criterion
chosen by the options, distillation, test-time augmentation's metrics, the summary, the recipe's options."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from torch import nn

from vitkit.tasks import ClassifyTask, build_criterion
from vitkit.tasks.base import TaskSetup
from vitkit.tasks.classify import DistillationLoss


@pytest.mark.parametrize("smoothing", [0.1, 0.3])
def test_label_smoothing_loss_is_timms(smoothing: float) -> None:
    """The fused ``nn.CrossEntropyLoss(label_smoothing=...)`` equals timm's
    LabelSmoothingCrossEntropy (a separate derivation: log-softmax, gathered NLL and the mean over
    classes, mixed by hand), in value and gradient, and differs from unsmoothed cross-entropy."""
    torch.manual_seed(0)
    logits = torch.randn(16, 7, requires_grad=True)
    targets = torch.randint(0, 7, (16,))
    mixer, criterion = build_criterion(7, label_smoothing=smoothing)
    assert mixer is None
    ours = criterion(logits, targets)
    (grad,) = torch.autograd.grad(ours, logits)
    reference = LabelSmoothingCrossEntropy(smoothing=smoothing)(logits, targets)
    (reference_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(ours, reference, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(grad, reference_grad, rtol=1e-5, atol=1e-7)
    assert not torch.isclose(ours, nn.functional.cross_entropy(logits, targets))


def test_training_accuracy_is_computed_only_when_asked() -> None:
    """The training step's top-1 is a function the loop calls on logging steps only; called, it
    is the share of correct argmax predictions in percent."""
    model = nn.Linear(3, 4)
    with torch.no_grad():
        model.weight.copy_(torch.eye(4, 3))
        model.bias.zero_()
    mixer, criterion = build_criterion(4)
    task = ClassifyTask(mixer, criterion)
    images = torch.tensor([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0], [5.0, 0, 0]])  # argmax: 0, 1, 2, 0
    out = task.training_step(model, (images, torch.tensor([0, 1, 0, 3])))
    assert callable(out.metrics["acc1"])
    assert out.metrics["acc1"]().item() == pytest.approx(50.0)


def by_hand_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("kind", ["hard", "soft"])
def test_the_distillation_loss_is_deits(kind: str) -> None:
    """facebookresearch/deit ``losses.py`` written out in numpy: ``(1 - alpha) CE(cls, y)`` plus
    ``alpha CE(dist, argmax teacher)`` (hard) or ``alpha tau^2 sum KL(p_t || p_s) / (B C)`` (soft)."""
    torch.manual_seed(0)
    cls, dist, teacher = torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5, dtype=torch.float64), torch.randn(6, 5)
    labels = torch.randint(0, 5, (6,))
    alpha, tau = 0.3, 2.0
    loss = DistillationLoss(nn.CrossEntropyLoss(), kind, alpha, tau)(cls, dist, labels, teacher)
    rows = np.arange(6)
    base = -np.log(by_hand_softmax(cls.numpy())[rows, labels.numpy()]).mean()
    if kind == "hard":
        term = -np.log(by_hand_softmax(dist.numpy())[rows, teacher.numpy().argmax(axis=1)]).mean()
    else:
        p_s, p_t = by_hand_softmax(dist.numpy() / tau), by_hand_softmax(teacher.double().numpy() / tau)
        term = (p_t * (np.log(p_t) - np.log(p_s))).sum() * tau * tau / p_s.size
    assert loss.item() == pytest.approx((1 - alpha) * base + alpha * term, rel=1e-6)
    with pytest.raises(ValueError, match="'hard' or 'soft', got 'none'"):
        DistillationLoss(nn.CrossEntropyLoss(), "none", alpha, tau)


def test_the_criterion_is_chosen_by_mixing_and_smoothing() -> None:
    mixer, criterion = build_criterion(5, mixup=0.8, cutmix=1.0, mixup_prob=0.7, mixup_switch_prob=0.3, label_smoothing=0.2)
    assert isinstance(criterion, SoftTargetCrossEntropy)
    assert (mixer.mixup_alpha, mixer.cutmix_alpha, mixer.mix_prob, mixer.switch_prob, mixer.label_smoothing,
            mixer.num_classes) == (0.8, 1.0, 0.7, 0.3, 0.2, 5)  # 0.2: timm's Mixup defaults to 0.1
    for only in (dict(mixup=0.5), dict(cutmix=0.5)):
        assert build_criterion(5, **only)[0] is not None
    mixer, criterion = build_criterion(5, mixup=0.8, mixup_prob=0.0, label_smoothing=0.2)  # never mixes
    assert mixer is None and criterion.label_smoothing == 0.2
    mixer, criterion = build_criterion(5)
    assert mixer is None and type(criterion) is nn.CrossEntropyLoss and criterion.label_smoothing == 0.0


class TwoHeads(nn.Module):
    """A student with a distillation token's head: ``(class, distillation)`` logits."""

    def __init__(self) -> None:
        super().__init__()
        self.cls, self.dist = nn.Linear(4, 3), nn.Linear(4, 3)
        self.distilled_training = False

    def set_distilled_training(self, enable: bool) -> None:
        self.distilled_training = enable

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cls(images), self.dist(images)


def test_distillation_trains_the_distillation_head_on_the_attached_teacher() -> None:
    torch.manual_seed(0)
    student, teacher = TwoHeads(), nn.Linear(4, 3)
    task = ClassifyTask(None, nn.CrossEntropyLoss(), distill="hard", alpha=0.25, tau=1.0)
    with pytest.raises(RuntimeError) as caught:
        task.on_fit_start(torch.device("cpu"))
    assert str(caught.value) == "distillation is configured but no teacher was attached (attach_teacher)."
    default = ClassifyTask(None, nn.CrossEntropyLoss(), distill="soft").distill_loss
    assert (default.alpha, default.tau) == (0.5, 1.0)  # DeiT's
    task.attach_teacher(teacher)
    task.on_fit_start(torch.device("cpu"))
    task.prepare(student)
    assert student.distilled_training
    images, labels = torch.randn(8, 4), torch.randint(0, 3, (8,))
    out = task.training_step(student, (images, labels))
    cls, dist = student(images)
    expected = 0.75 * F.cross_entropy(cls, labels) + 0.25 * F.cross_entropy(dist, teacher(images).argmax(dim=1))
    torch.testing.assert_close(out.loss, expected)
    assert out.batch_size == 8 and out.metrics["acc1"]().item() == pytest.approx(
        100.0 * (cls.argmax(dim=1) == labels).float().mean().item())
    plain = ClassifyTask(None, nn.CrossEntropyLoss())
    plain.prepare(student2 := TwoHeads())
    assert not student2.distilled_training
    torch.testing.assert_close(plain.training_step(student2, (images, labels)).loss,
                               F.cross_entropy(student2(images)[0], labels))


def test_a_mixed_batch_trains_on_soft_targets_and_logs_no_accuracy() -> None:
    torch.manual_seed(0)
    mixer, criterion = build_criterion(3, mixup=1.0, mixup_prob=1.0)
    task = ClassifyTask(mixer, criterion)
    out = task.training_step(nn.Sequential(nn.Flatten(), nn.Linear(16, 3)), (torch.randn(4, 1, 4, 4), torch.tensor([0, 1, 2, 0])))
    assert out.metrics == {} and out.loss.ndim == 0


def linear_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 6))


def test_evaluation_averages_the_views_probabilities_and_reports_the_single_views_beside() -> None:
    """``'hflip'``: the loss and accuracies of the mean of the image's and its mirror's
    probabilities (computed here), and the image alone's top-1; validation uses ``val_tta``."""
    model, images = linear_model(), torch.randn(12, 1, 4, 4)
    labels = torch.randint(0, 6, (12,))
    task = ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip", val_tta="none")
    with torch.no_grad():
        one, mirrored = model(images).numpy(), model(images.flip(-1)).numpy()
        out = task.evaluation_step(model, (images, labels), "test")
    probs = (by_hand_softmax(one) + by_hand_softmax(mirrored)) / 2
    y = labels.numpy()
    assert out.loss.item() == pytest.approx(-np.log(probs[np.arange(12), y]).mean(), rel=1e-5)
    assert out.metrics["acc1"].item() == pytest.approx(100 * (probs.argmax(axis=1) == y).mean())
    top5 = np.argsort(-probs, axis=1)[:, :5]
    assert out.metrics["acc5"].item() == pytest.approx(100 * (top5 == y[:, None]).any(axis=1).mean())
    assert out.metrics["acc1_one_view"].item() == pytest.approx(100 * (one.argmax(axis=1) == y).mean())
    assert "acc1_mirrored" not in out.metrics and out.batch_size == 12
    val = task.evaluation_step(model, (images, labels), "val")
    assert set(val.metrics) == {"acc1", "acc5"}
    assert ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip").val_tta == "hflip"
    shifted = ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip_shift", fill=torch.zeros(1))
    with torch.no_grad():
        assert shifted.evaluation_step(model, (images, labels), "test").metrics["acc1_mirrored"].item() == pytest.approx(
            out.metrics["acc1"].item())


def test_the_summary_records_the_test_time_augmentation_and_its_single_view_accuracies() -> None:
    measured = {"val/acc1": 80.0, "test/acc1": 70.0, "test/acc5": 90.0, "test/acc1_one_view": 65.0,
                "test/acc1_mirrored": 68.0}
    summary = ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip_shift", val_tta="hflip").summary(measured.get)
    assert summary == {"val_acc": 80.0, "test_acc": 70.0, "test_acc5": 90.0, "tta": "hflip_shift", "val_tta": "hflip",
                       "test_acc_one_view": 65.0, "test_acc_mirrored": 68.0}
    assert ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip").summary(measured.get)["test_acc_one_view"] == 65.0
    assert "test_acc_mirrored" not in ClassifyTask(None, nn.CrossEntropyLoss(), tta="hflip").summary(measured.get)
    assert "test_acc_one_view" not in ClassifyTask(None, nn.CrossEntropyLoss()).summary(measured.get)


def test_from_recipe_threads_the_regularisers_distillation_and_test_time_augmentation() -> None:
    recipe = SimpleNamespace(
        optim=SimpleNamespace(mixup=0.8, cutmix=1.0, mixup_prob=0.7, mixup_switch_prob=0.3, label_smoothing=0.1),
        distill=SimpleNamespace(type="soft", alpha=0.2, tau=3.0), trainer=SimpleNamespace(tta="hflip_shift", val_tta="none"))
    model = SimpleNamespace(num_classes=5)
    task = ClassifyTask.from_recipe(None, TaskSetup(model, {"mean": (0.5, 0.2), "std": (0.25, 0.1)}, recipe, 1))
    assert (task.mixup.mixup_alpha, task.mixup.cutmix_alpha, task.mixup.mix_prob, task.mixup.switch_prob,
            task.mixup.label_smoothing, task.mixup.num_classes) == (0.8, 1.0, 0.7, 0.3, 0.1, 5)
    assert (task.distill_loss.kind, task.distill_loss.alpha, task.distill_loss.tau) == ("soft", 0.2, 3.0)
    assert (task.tta, task.val_tta) == ("hflip_shift", "none")
    torch.testing.assert_close(task.fill, torch.tensor([-2.0, -2.0]))
    assert ClassifyTask.from_recipe(None, TaskSetup(model, {"mean": (0.5,)}, recipe, 1)).fill is None
