"""The classification objective's losses against timm's, its training metric's laziness."""

from __future__ import annotations

import pytest
import torch
from timm.loss import LabelSmoothingCrossEntropy
from torch import nn

from vitkit.tasks import ClassifyTask, build_criterion


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
