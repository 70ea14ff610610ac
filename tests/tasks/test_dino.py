"""DINO (``vitkit.tasks.dino``): the loss and the centre equal facebookresearch/dino's ``DINOLoss``
written out here, and the task follows its temperature schedule and frozen last layer over epochs;
the teacher gets no gradient and follows the student by the momentum DINO's cosine schedule gives;
the head is DINO's; the multi-crop views have the right count and sizes, differ, and with the
draws forced are PIL's solarised pixels normalised; the exported model is the teacher's backbone."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from PIL import Image, ImageOps
from torch import nn
from torch.utils.data import DataLoader
from torchvision.transforms import Normalize
from torchvision.transforms.functional import to_tensor

from vitkit.data import ArrayDataset, multicrop
from vitkit.data.multicrop import MultiCrop, multi_crop_dataset
from vitkit.models import VisionTransformer, ViTConfig
from vitkit.schema import FieldError
from vitkit.tasks.base import TaskSetup
from vitkit.tasks.dino import (
    DinoHead,
    DinoTask,
    dino_loss,
    teacher_momentum,
    teacher_temperature,
    updated_center,
)
from vitkit.tasks.dino_options import DinoOptions, head_weights

MEAN, STD = (0.5,), (0.25,)


class ReferenceDINOLoss(nn.Module):
    """facebookresearch/dino ``main_dino.py``'s ``DINOLoss``, as written there (one process: the
    centre's ``all_reduce`` is the identity and the world size 1)."""

    def __init__(self, out_dim, ncrops, warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs, nepochs,
                 student_temp=0.1, center_momentum=0.9):
        super().__init__()
        self.student_temp = student_temp
        self.center_momentum = center_momentum
        self.ncrops = ncrops
        self.register_buffer("center", torch.zeros(1, out_dim))
        self.teacher_temp_schedule = np.concatenate((
            np.linspace(warmup_teacher_temp, teacher_temp, warmup_teacher_temp_epochs),
            np.ones(nepochs - warmup_teacher_temp_epochs) * teacher_temp,
        ))

    def forward(self, student_output, teacher_output, epoch):
        student_out = student_output / self.student_temp
        student_out = student_out.chunk(self.ncrops)
        temp = self.teacher_temp_schedule[epoch]
        teacher_out = F.softmax((teacher_output - self.center) / temp, dim=-1)
        teacher_out = teacher_out.detach().chunk(2)
        total_loss = 0
        n_loss_terms = 0
        for iq, q in enumerate(teacher_out):
            for v in range(len(student_out)):
                if v == iq:
                    continue
                loss = torch.sum(-q * F.log_softmax(student_out[v], dim=-1), dim=-1)
                total_loss += loss.mean()
                n_loss_terms += 1
        total_loss /= n_loss_terms
        self.update_center(teacher_output)
        return total_loss

    @torch.no_grad()
    def update_center(self, teacher_output):
        batch_center = torch.sum(teacher_output, dim=0, keepdim=True)
        batch_center = batch_center / len(teacher_output)
        self.center = self.center * self.center_momentum + batch_center * (1 - self.center_momentum)


def tiny_model(dynamic: bool = True) -> VisionTransformer:
    return VisionTransformer(ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1,
                                       num_heads=2, mlp_ratio=2.0, dynamic_img_size=dynamic))


def tiny_task(epochs: int = 3, **options) -> DinoTask:
    crops = MultiCrop(MEAN, STD, global_size=8, local_size=4, local_crops=2)
    task = DinoTask(16, crops, epochs=epochs, options=DinoOptions(out_dim=32, hidden_dim=24, bottleneck_dim=8, **options))
    return task


def test_loss_and_centre_equal_dino_reference_over_steps_and_epochs() -> None:
    torch.manual_seed(0)
    ncrops, batch, dim, epochs = 5, 6, 40, 4
    reference = ReferenceDINOLoss(dim, ncrops, 0.04, 0.07, 3, epochs)
    center = torch.zeros(1, dim)
    for epoch in range(epochs):  # the centre moves between calls, the temperature between epochs
        student, teacher = torch.randn(ncrops * batch, dim) * 3, torch.randn(2 * batch, dim) * 3
        expected = reference(student, teacher, epoch)
        temp = teacher_temperature(epoch, 0.04, 0.07, 3)
        assert temp == pytest.approx(reference.teacher_temp_schedule[epoch])
        loss = dino_loss(student, teacher, center, 0.1, temp)
        center = updated_center(center, teacher, 0.9)
        torch.testing.assert_close(loss, expected, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(center, reference.center, rtol=1e-6, atol=1e-7)


def test_loss_leaves_out_same_view_pairs() -> None:
    """A student that copies the teacher on its own view but not on the others still pays the cross terms."""
    torch.manual_seed(1)
    teacher = torch.randn(2 * 3, 10)
    same = torch.cat([teacher, torch.randn(3, 10)])
    swapped = torch.cat([teacher[3:], teacher[:3], same[6:]])
    zero = torch.zeros(1, 10)
    assert dino_loss(same, teacher, zero, 1.0, 1.0) != pytest.approx(dino_loss(swapped, teacher, zero, 1.0, 1.0).item())


def test_momentum_follows_dino_cosine_schedule() -> None:
    total, base = 10, 0.996
    schedule = 1 + 0.5 * (base - 1) * (1 + np.cos(np.pi * np.arange(total) / total))  # utils.cosine_scheduler(base, 1)
    assert [teacher_momentum(step, total, base) for step in range(total)] == pytest.approx(schedule.tolist())
    assert teacher_momentum(0, total, base) == pytest.approx(base)


def test_teacher_gets_no_gradient_and_student_does() -> None:
    torch.manual_seed(0)
    model, task = tiny_model(), tiny_task()
    task.prepare(model)
    task.train()
    images = (torch.rand(4, 8, 8, 1) * 255).to(torch.uint8)
    out = task.training_step(model, (task.crops(images), torch.zeros(4)))
    out.loss.backward()
    teacher = [*task.teacher_backbone.parameters(), *task.teacher_head.parameters()]
    assert all(p.grad is None and not p.requires_grad for p in teacher)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert task.student_head.mlp[0].weight.grad is not None
    assert task.student_head.last_layer.parametrizations.weight.original1.grad is None  # frozen in the first epoch


def test_the_task_follows_dinos_temperature_schedule_and_frozen_last_layer_over_epochs() -> None:
    """Four epochs of two steps: the teacher's temperature warms up from 0.02 to 0.06 over 3 epochs
    (DINOLoss's ``teacher_temp_schedule``), each step's loss and centre are DINOLoss's on the same
    outputs, and the last layer gets no gradient while ``epoch < freeze_last_layer`` (2), as
    ``utils.cancel_gradients_last_layer`` cancels it."""
    torch.manual_seed(0)
    epochs, per_epoch, frozen = 4, 2, 2
    model = tiny_model()
    task = tiny_task(epochs, warmup_teacher_temp=0.02, teacher_temp=0.06, warmup_teacher_temp_epochs=3,
                     freeze_last_layer_epochs=frozen)
    task.prepare(model)
    task.train()
    reference = ReferenceDINOLoss(32, task.crops.num_crops, 0.02, 0.06, 3, epochs)
    last_layer = task.student_head.last_layer.parametrizations.weight.original1
    total = epochs * per_epoch
    for step in range(total):
        epoch = step // per_epoch
        crops = task.crops((torch.rand(4, 8, 8, 1) * 255).to(torch.uint8))
        with torch.no_grad():
            expected = reference(task.student_outputs(model, crops), task.teacher_outputs(crops[:2]), epoch)
        last_layer.grad = None
        out = task.training_step(model, (crops, torch.zeros(4)))
        out.loss.backward()
        assert out.metrics["teacher_temp"].item() == pytest.approx(reference.teacher_temp_schedule[epoch])
        torch.testing.assert_close(out.loss, expected, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(task.center, reference.center, rtol=1e-5, atol=1e-7)
        assert (last_layer.grad is None) == (epoch < frozen), f"epoch {epoch}"
        task.after_optimizer_step(model, step + 1, total)
    assert reference.teacher_temp_schedule.tolist() == pytest.approx([0.02, 0.04, 0.06, 0.06])


def test_teacher_runs_without_stochastic_depth_in_training() -> None:
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=2,
                                        num_heads=2, mlp_ratio=2.0, drop_path_rate=0.5))
    task = tiny_task()
    task.prepare(model)
    task.train()
    views = [torch.randn(8, 1, 8, 8)] * 2
    torch.testing.assert_close(task.teacher_outputs(views), task.teacher_outputs(views))
    assert task.teacher_backbone.training  # back in the mode Lightning set


def test_teacher_ema_update_matches_hand_computation() -> None:
    torch.manual_seed(0)
    model, task = tiny_model(), tiny_task(teacher_momentum=0.9)
    task.prepare(model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))
        for p in task.student_head.parameters():
            p.add_(torch.randn_like(p))
    before = {name: p.clone() for name, p in task.named_parameters() if name.startswith("teacher")}
    student = {**{f"teacher_backbone.{n}": p for n, p in model.named_parameters()},
               **{f"teacher_head.{n}": p for n, p in task.student_head.named_parameters()}}
    task.after_optimizer_step(model, step=4, total_steps=10)  # the 4th step: index 3
    momentum = 1 - (1 - 0.9) * (1 + math.cos(math.pi * 3 / 10)) / 2
    for name, value in before.items():
        expected = momentum * value + (1 - momentum) * student[name].detach()
        torch.testing.assert_close(dict(task.named_parameters())[name], expected)
    assert task.epoch_progress.item() == pytest.approx(4 * 3 / 10)


def test_head_is_dino_head() -> None:
    torch.manual_seed(0)
    head = DinoHead(16, 32, hidden_dim=24, bottleneck_dim=8, layers=3)
    assert [type(m) for m in head.mlp] == [nn.Linear, nn.GELU, nn.Linear, nn.GELU, nn.Linear]
    assert head.mlp[-1].out_features == 8 and head.last_layer.out_features == 32
    weight = head.last_layer.weight
    torch.testing.assert_close(weight.norm(dim=1), torch.ones(32))  # weight-normalised, norms fixed at 1
    assert not head.last_layer.parametrizations.weight.original0.requires_grad
    x = torch.randn(5, 16)
    bottleneck = F.normalize(head.mlp(x), dim=-1)
    torch.testing.assert_close(head(x), bottleneck @ weight.T)
    assert (head(x).abs() <= 1 + 1e-5).all()  # cosines: unit rows against unit rows


def test_multi_crop_count_sizes_and_differences() -> None:
    torch.manual_seed(0)
    crops = MultiCrop(MEAN, STD, global_size=8, local_size=4, local_crops=3)
    images = (torch.rand(6, 8, 8, 1) * 255).to(torch.uint8)
    views = crops(images)
    assert len(views) == 5 == crops.num_crops
    assert [tuple(v.shape) for v in views] == [(6, 1, 8, 8)] * 2 + [(6, 1, 4, 4)] * 3
    assert not torch.allclose(views[0], views[1])
    plain = (images.permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25
    assert not torch.allclose(views[0], plain)
    assert not torch.allclose(views[2], views[3])


def test_global_crops_with_the_draws_forced_are_pils_solarised_pixels_normalised(monkeypatch) -> None:
    """No jitter, grayscale or blur, the second crop always solarised, the whole image unmirrored:
    the crops are torchvision's ``Normalize(mean, std)(ToTensor()(image))``, the second one of PIL's
    ``ImageOps.solarize(image, 128)`` (which inverts the pixels >= 128)."""
    for name, value in (("JITTER_PROBABILITY", 0.0), ("GRAYSCALE_PROBABILITY", 0.0),
                        ("BLUR_PROBABILITY", (0.0, 0.0, 0.0)), ("SOLARIZE_PROBABILITY", 1.0)):
        monkeypatch.setattr(multicrop, name, value)
    mean, std = (0.4, 0.5, 0.6), (0.2, 0.25, 0.3)
    crops = MultiCrop(mean, std, global_size=8, local_size=4, local_crops=0, global_scale=(1.0, 1.0), hflip=0.0)
    image = np.random.default_rng(0).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    image[0, :4] = [[127, 128, 0], [128, 127, 255], [126, 129, 128], [255, 0, 127]]  # both sides of the threshold
    plain, solarised = crops.one(image)
    pil = Image.fromarray(image)
    normalise = Normalize(mean, std)
    torch.testing.assert_close(plain, normalise(to_tensor(pil)), rtol=0, atol=1e-5)
    torch.testing.assert_close(solarised, normalise(to_tensor(ImageOps.solarize(pil, threshold=128))), rtol=0, atol=1e-5)


def test_multi_crop_dataset_batches_are_lists_of_crops() -> None:
    images = np.random.default_rng(0).integers(0, 255, (10, 8, 8, 1), dtype=np.uint8)
    base = ArrayDataset(images, np.arange(10) % 2, transform=lambda image: torch.zeros(1))
    dataset = multi_crop_dataset(base, MultiCrop(MEAN, STD, global_size=8, local_size=4, local_crops=2))
    views, labels = next(iter(DataLoader(dataset, batch_size=4)))
    assert [tuple(v.shape) for v in views] == [(4, 1, 8, 8)] * 2 + [(4, 1, 4, 4)] * 2
    assert labels.tolist() == [0, 1, 0, 1]
    one, label = dataset[3]  # the per-image path gives the same views
    assert [tuple(v.shape) for v in one] == [(1, 8, 8)] * 2 + [(1, 4, 4)] * 2 and label == 1


def test_exported_model_is_the_teacher_backbone() -> None:
    torch.manual_seed(0)
    model, task = tiny_model(), tiny_task()
    task.prepare(model)
    with torch.no_grad():
        model.patch_embed.proj.weight.add_(1.0)
    task.after_optimizer_step(model, 5, 10)
    exported = task.exported_model(model)
    assert exported is task.teacher_backbone
    assert not torch.equal(exported.patch_embed.proj.weight, model.patch_embed.proj.weight)


@pytest.mark.parametrize(("in_dim", "out_dim", "hidden", "bottleneck", "layers"), [(32, 16, 8, 4, 3), (24, 100, 12, 6, 1),
                                                                                  (8, 10, 5, 3, 2)])
def test_the_heads_counted_weights_are_its_parameters(in_dim: int, out_dim: int, hidden: int, bottleneck: int,
                                                      layers: int) -> None:
    head = DinoHead(in_dim, out_dim, hidden_dim=hidden, bottleneck_dim=bottleneck, layers=layers)
    counted = head_weights(in_dim, out_dim, hidden_dim=hidden, bottleneck_dim=bottleneck, layers=layers)
    assert counted == sum(p.numel() for p in head.parameters())


def test_the_heads_defaults_are_dinos_and_its_last_layer_learns_unless_frozen() -> None:
    """``DINOHead``'s defaults (hidden 2048, bottleneck 256, 3 layers); the last layer gets a
    gradient in a plain call and none with ``freeze_last_layer``; its weights start as a truncated
    normal of std 0.02 (DINO's ``_init_weights``)."""
    torch.manual_seed(0)
    head = DinoHead(64, 10)
    assert [(m.in_features, m.out_features) for m in head.mlp if isinstance(m, nn.Linear)] == [(64, 2048), (2048, 2048), (2048, 256)]
    assert head.mlp[2].weight.std().item() == pytest.approx(0.02, rel=0.01)  # timm's cut at +-2 is 100 std away
    direction = head.last_layer.parametrizations.weight.original1
    head(torch.randn(3, 64)).sum().backward()
    assert direction.grad is not None and direction.grad.abs().sum() > 0
    direction.grad = None
    head(torch.randn(3, 64), freeze_last_layer=True).sum().backward()
    assert direction.grad is None


def test_teacher_temperature_and_momentum_at_the_edges_are_dinos_schedules() -> None:
    """``np.linspace(warmup, temp, n)`` for warm-ups of one and two epochs; a run of one step
    moves the momentum from ``base`` (step 0) to 1 (step 1), as ``cosine_scheduler`` over 1 step."""
    for warmup_epochs in (1, 2):
        expected = np.linspace(0.04, 0.07, warmup_epochs).tolist() + [0.07]
        assert [teacher_temperature(e, 0.04, 0.07, warmup_epochs) for e in range(warmup_epochs + 1)] == pytest.approx(expected)
    assert teacher_momentum(0, 1, 0.9) == pytest.approx(0.9)
    assert teacher_momentum(1, 1, 0.9) == pytest.approx(1.0)


def test_the_tasks_head_follows_its_options_and_defaults_to_dinos() -> None:
    crops = MultiCrop(MEAN, STD, global_size=8, local_size=4, local_crops=2)
    task = DinoTask(16, crops, epochs=2, options=DinoOptions(out_dim=12, hidden_dim=7, bottleneck_dim=5, head_layers=2,
                                                              norm_last_layer=False))
    widths = [(m.in_features, m.out_features) for m in task.student_head.mlp if isinstance(m, nn.Linear)]
    assert widths == [(16, 7), (7, 5)] and task.student_head.last_layer.out_features == 12
    assert task.student_head.last_layer.parametrizations.weight.original0.requires_grad  # norms learn
    default = DinoTask(16, crops, epochs=2)
    assert default.student_head.last_layer.out_features == DinoOptions().out_dim
    assert not default.student_head.last_layer.parametrizations.weight.original0.requires_grad


def test_a_training_step_logs_the_teachers_entropy_and_weighs_by_its_images() -> None:
    """The logged entropy is ``-sum p log p`` of the teacher's centred, sharpened softmax, averaged
    over its rows, computed here from the teacher's outputs; the step's weight is its image count."""
    torch.manual_seed(0)
    model, task = tiny_model(), tiny_task()
    task.prepare(model)
    task.center.normal_()
    center = task.center.clone()
    crops = task.crops((torch.rand(5, 8, 8, 1) * 255).to(torch.uint8))
    teacher = task.teacher_outputs(crops[:2]).double()
    out = task.training_step(model, (crops, torch.zeros(5)))
    probs = np.exp((teacher - center.double()).numpy() / task.current_teacher_temp)
    probs /= probs.sum(axis=1, keepdims=True)
    entropy = -(probs * np.log(probs)).sum(axis=1).mean()
    assert out.metrics["teacher_entropy"].item() == pytest.approx(entropy, rel=1e-4)
    assert out.batch_size == 5


def test_the_student_reads_the_pooled_feature_and_its_last_layer_learns_by_default() -> None:
    """A model with a classifier still hands the head its pooled feature (not its logits)."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=3, embed_dim=16, depth=1,
                                        num_heads=2, mlp_ratio=2.0))
    task = tiny_task()
    views = [torch.randn(2, 1, 8, 8)] * 2
    pooled = model.forward_head(model.forward_features(torch.cat(views)), pre_logits=True)
    out = task.student_outputs(model, views)
    torch.testing.assert_close(out, task.student_head(pooled))
    out.sum().backward()
    assert task.student_head.last_layer.parametrizations.weight.original1.grad is not None


def test_from_recipe_builds_the_crops_and_head_from_the_options_and_the_data() -> None:
    """Each crop option reaches :class:`MultiCrop`, the data's mean and std normalise the crops,
    ``null`` global size takes the model's; only training images are multi-cropped."""
    model = ViTConfig(img_size=8, patch_size=2, in_chans=1, num_classes=0, embed_dim=16, depth=1, num_heads=2,
                      dynamic_img_size=True)
    options = DinoOptions(out_dim=12, hidden_dim=7, bottleneck_dim=5, local_crops=3, local_size=4,
                          global_scale=(0.5, 0.9), local_scale=(0.1, 0.3))
    setup = TaskSetup(model=model, extra={"mean": (0.3,), "std": (0.2,)}, recipe=None, epochs=7)
    task = DinoTask.from_recipe(options, setup)
    crops = task.crops
    assert (crops.global_size, crops.local_size, crops.local_crops) == (8, 4, 3)
    assert (tuple(crops.global_scale), tuple(crops.local_scale)) == ((0.5, 0.9), (0.1, 0.3))
    assert crops.mean.flatten().tolist() == pytest.approx([0.3]) and crops.std.flatten().tolist() == pytest.approx([0.2])
    assert task.epochs == 7 and task.student_head.mlp[0].in_features == 16 and task.student_head.last_layer.out_features == 12
    task.set_epochs(11)
    assert task.epochs == 11
    base = ArrayDataset(np.zeros((4, 8, 8, 1), dtype=np.uint8), np.zeros(4, dtype=np.int64), transform=lambda image: image)
    views, _ = task.split_data(base, "train")[0]
    assert [tuple(v.shape) for v in views] == [(1, 8, 8)] * 2 + [(1, 4, 4)] * 3
    assert task.split_data(base, "val") is base and task.split_data(base, "test") is base


def test_conflicts_and_the_augment_refusal_name_what_to_change() -> None:
    recipe = SimpleNamespace(optim=SimpleNamespace(ema=True), model=SimpleNamespace(impl="timm"),
                             trainer=SimpleNamespace(strategy="fsdp_full"), data=SimpleNamespace(augment=SimpleNamespace(enabled=True)))
    assert DinoTask.conflicts(DinoOptions(), recipe) == [
        "optim.ema=true (the teacher is the average DINO keeps and releases)",
        "model.impl=timm (DINO trains vitkit's model)", "trainer.strategy=fsdp (the teacher is not sharded)"]
    plain = SimpleNamespace(optim=SimpleNamespace(ema=False), model=SimpleNamespace(impl="vitkit"),
                            trainer=SimpleNamespace(strategy="ddp"))
    assert DinoTask.conflicts(DinoOptions(), plain) == []
    with pytest.raises(FieldError) as caught:
        DinoTask.check_recipe(DinoOptions(), recipe)
    assert str(caught.value) == (
        "data.augment.enabled is true, but DINO trains on its own multi-crop views, never on data.augment's: set "
        "data.augment.enabled=false, and shape the views with task.dino's local_crops, global_size, local_size, "
        "global_scale and local_scale.")
