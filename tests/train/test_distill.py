"""DeiT distillation (Touvron et al. 2020, arXiv 2012.12877): the losses against their formulas on
hand-computed logits, the teacher frozen through training steps, and a run that trains a timm CNN
teacher first in the same command."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import timm
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from tiny_runs import SHORT, tiny_recipe
from torch import nn

from vitkit.data import DataInfo
from vitkit.io import save_model
from vitkit.models import VisionTransformer, ViTConfig
from vitkit.tasks import DistillationLoss
from vitkit.train import RecipeError, load_recipe, train
from vitkit.train.distill import TEACHER_FILE, TeacherConfig, build_teacher, freeze
from vitkit.train.module import ViTModule

CLASS_LOGITS = [[2.0, 0.0, 0.0], [0.0, 1.0, -1.0]]
DIST_LOGITS = [[0.0, 1.0, 0.0], [1.0, 0.0, 2.0]]
TEACHER_LOGITS = [[0.0, 0.0, 3.0], [0.0, 4.0, 0.0]]
LABELS = [0, 1]


def log_softmax(row: list[float], tau: float = 1.0) -> list[float]:
    logs = [x / tau for x in row]
    total = math.log(sum(math.exp(x) for x in logs))
    return [x - total for x in logs]


def cross_entropy(rows: list[list[float]], labels: list[int]) -> float:
    return -sum(log_softmax(row)[y] for row, y in zip(rows, labels)) / len(rows)


def losses(kind: str, alpha: float, tau: float) -> float:
    loss = DistillationLoss(nn.CrossEntropyLoss(), kind, alpha, tau)
    return loss(*(torch.tensor(x) for x in (CLASS_LOGITS, DIST_LOGITS, LABELS, TEACHER_LOGITS))).item()


@pytest.mark.parametrize("alpha", [0.5, 0.3])
def test_hard_distillation_is_ce_on_labels_plus_ce_on_the_teachers_argmax(alpha: float) -> None:
    teacher_argmax = [2, 1]  # of TEACHER_LOGITS, by eye
    expected = (1 - alpha) * cross_entropy(CLASS_LOGITS, LABELS) + alpha * cross_entropy(DIST_LOGITS, teacher_argmax)
    assert losses("hard", alpha, 1.0) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("tau", [1.0, 3.0])
def test_soft_distillation_is_deits_tau_squared_kl_summed_over_batch_and_classes_over_numel(tau: float) -> None:
    alpha = 0.4
    kl = 0.0
    for student, teacher in zip(DIST_LOGITS, TEACHER_LOGITS):  # KL(p_t || p_s), DeiT's kl_div(log p_s, log p_t)
        log_s, log_t = log_softmax(student, tau), log_softmax(teacher, tau)
        kl += sum(math.exp(t) * (t - s) for s, t in zip(log_s, log_t))
    numel = 2 * 3  # B x C: DeiT's legacy normalisation
    expected = (1 - alpha) * cross_entropy(CLASS_LOGITS, LABELS) + alpha * tau * tau * kl / numel
    assert losses("soft", alpha, tau) == pytest.approx(expected, rel=1e-6)


def test_distillation_term_uses_the_distillation_logits_and_alpha_zero_is_the_label_loss() -> None:
    assert losses("soft", 0.0, 2.0) == pytest.approx(cross_entropy(CLASS_LOGITS, LABELS), rel=1e-6)
    # the same class logits with other distillation logits give another loss: dist_logits are read
    loss = DistillationLoss(nn.CrossEntropyLoss(), "hard", 0.5, 1.0)
    args = [torch.tensor(x) for x in (CLASS_LOGITS, DIST_LOGITS, LABELS, TEACHER_LOGITS)]
    other = loss(args[0], args[0], args[2], args[3])
    assert abs(other.item() - loss(*args).item()) > 0.1


def tiny_vit(**overrides) -> VisionTransformer:
    fields = dict(img_size=8, patch_size=2, in_chans=1, num_classes=10, embed_dim=16, depth=1, num_heads=2, mlp_ratio=2.0)
    return VisionTransformer(ViTConfig(**{**fields, **overrides}))


@pytest.mark.filterwarnings("ignore:You are trying to `self.log()`")
def test_training_step_distils_from_a_frozen_teacher_whose_weights_never_change() -> None:
    recipe = tiny_recipe(Path("unused"))
    recipe["distill"] = {"type": "hard", "alpha": 0.5, "teacher": {"model": "test_resnet"}}
    student = tiny_vit()
    module = ViTModule(student, load_recipe(recipe), student.config, {})
    teacher = nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 36, 10))
    module.task.attach_teacher(freeze(teacher))
    assert "teacher" not in dict(module.named_children()) and not any(k.startswith("teacher") for k in module.state_dict())
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    optimizer = torch.optim.SGD(module.model.parameters(), lr=0.1)
    module.train()
    assert not teacher.training  # the LightningModule's train() does not reach it
    for _ in range(3):
        images, labels = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
        with torch.no_grad():
            logits, teacher_argmax = module.model(images), teacher(images).argmax(1)
        expected = 0.5 * F.cross_entropy(logits, labels) + 0.5 * F.cross_entropy(logits, teacher_argmax)
        loss = module.training_loss((images, labels))
        torch.testing.assert_close(loss.detach(), expected, atol=1e-6, rtol=1e-5)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert all(p.grad is None and not p.requires_grad for p in teacher.parameters())
    for key, value in teacher.state_dict().items():  # weights and BatchNorm statistics unchanged
        assert torch.equal(value, before[key]), key


def test_a_run_trains_a_timm_cnn_teacher_first_and_reports_it(tmp_path: Path) -> None:
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["distill"] = {"type": "soft", "tau": 2.0, "teacher": {"model": "test_resnet", "epochs": 1, "batch_size": 64}}
    result = train(recipe)
    assert result.summary["teacher"] == "test_resnet"
    assert 0 <= result.summary["teacher_val_acc"] <= 100 and result.summary["teacher_train_s"] > 0
    assert 0 <= result.summary["teacher_test_acc"] <= 100
    assert (result.run_dir / TEACHER_FILE).is_file()  # a resumed run distils from the same teacher
    assert result.summary["test_acc"] is not None
    resumed = train(recipe, ["trainer.max_epochs=2"], resume=result.run_dir / "checkpoints" / "last.ckpt")
    assert resumed.run_dir == result.run_dir and "teacher_train_s" not in resumed.summary  # loaded, not retrained


def test_a_vitkit_model_file_teacher_must_fit_the_data(tmp_path: Path) -> None:
    path = save_model(tiny_vit(num_classes=3), tmp_path / "teacher.safetensors")
    recipe = tiny_recipe(tmp_path, **SHORT)
    recipe["distill"] = {"type": "hard", "teacher": {"file": str(path)}}
    with pytest.raises(RecipeError, match="classifies 3 classes .* the data has 10 classes"):
        train(recipe)
    assert not (tmp_path / "tiny").exists()  # refused before a run directory was claimed


def test_distill_recipe_section_is_checked_before_anything_runs() -> None:
    with pytest.raises(RecipeError, match="distill.teacher .*must name teacher.model"):
        load_recipe("recipes/fashion_mnist.yaml", ["distill.type=hard"])
    with pytest.raises(RecipeError, match="Did you mean 'resnet18'"):
        load_recipe("recipes/fashion_mnist.yaml", ["distill.type=hard", "distill.teacher.model=resnet81"])
    with pytest.raises(RecipeError, match="distill.tau"):
        load_recipe("recipes/fashion_mnist.yaml", ["distill.tau=0"])


@pytest.mark.filterwarnings("ignore:You are trying to `self.log()`")
def test_a_distilled_student_learns_labels_on_its_class_head_and_the_teacher_on_its_distillation_head() -> None:
    recipe = tiny_recipe(Path("unused"))
    recipe["distill"] = {"type": "hard", "alpha": 0.5, "teacher": {"model": "test_resnet"}}
    student = tiny_vit(distilled=True)
    module = ViTModule(student, load_recipe(recipe), student.config, {})
    teacher = freeze(nn.Sequential(nn.Flatten(), nn.Linear(64, 10)))
    module.task.attach_teacher(teacher)
    model = module.model.train()
    images, labels = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    with torch.no_grad():
        features = model.forward_features(images)  # class token at 0, distillation token at 1
        cls_logits, dist_logits = model.head(features[:, 0]), model.head_dist(features[:, 1])
        teacher_argmax = teacher(images).argmax(1)
    expected = 0.5 * F.cross_entropy(cls_logits, labels) + 0.5 * F.cross_entropy(dist_logits, teacher_argmax)
    torch.testing.assert_close(module.training_loss((images, labels)).detach(), expected, atol=1e-6, rtol=1e-5)
    module.eval()  # evaluation averages the two heads, as DeiT
    torch.testing.assert_close(module(images), (cls_logits + dist_logits) / 2, atol=1e-6, rtol=1e-5)


FASHION_28PX = DataInfo(
    num_classes=10, class_names=tuple(map(str, range(10))), img_size=(28, 28), in_chans=1, mean=(0.5,), std=(0.5,),
    name="fashion_mnist",
)


def last_stage_map(teacher: nn.Module) -> tuple[int, ...]:
    with torch.no_grad():
        return tuple(teacher.eval().forward_features(torch.zeros(1, 1, 28, 28)).shape[1:])


def test_the_small_input_stem_keeps_a_28px_image_at_4x4_in_the_last_stage_where_timms_stem_leaves_1x1() -> None:
    # resnet18: stem stride 4, then stages of stride 1, 2, 2, 2: 28 -> 7 -> 7, 4, 2, 1 with timm's stem;
    # with He et al.'s CIFAR stem (3x3 stride 1, no pooling): 28 -> 28, 14, 7, 4
    assert last_stage_map(build_teacher(TeacherConfig(model="resnet18"), FASHION_28PX)) == (512, 1, 1)
    teacher = build_teacher(TeacherConfig(model="resnet18", small_input_stem=True), FASHION_28PX)
    assert last_stage_map(teacher) == (512, 4, 4)
    assert (teacher.conv1.kernel_size, teacher.conv1.stride, teacher.conv1.in_channels) == ((3, 3), (1, 1), 1)
    assert isinstance(teacher.maxpool, nn.Identity)
    assert teacher.conv1.weight.is_contiguous(memory_format=torch.channels_last)  # oneDNN's fast layout


def test_model_kwargs_reach_timm_and_a_narrow_resnet10_has_the_widths_asked_for() -> None:
    config = TeacherConfig(
        model="resnet18", small_input_stem=True,
        model_kwargs={"layers": [1, 1, 1, 1], "channels": [16, 32, 64, 128], "stem_width": 16},
    )
    teacher = build_teacher(config, FASHION_28PX)
    assert last_stage_map(teacher) == (128, 4, 4)
    stages = [getattr(teacher, f"layer{i}") for i in range(1, 5)]
    assert [len(stage) for stage in stages] == [1, 1, 1, 1]
    assert [stage[0].conv2.out_channels for stage in stages] == [16, 32, 64, 128]


def test_teacher_options_that_cannot_apply_are_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="small_input_stem needs a ResNet-style stem .* 'test_vit'"):
        build_teacher(TeacherConfig(model="test_vit", small_input_stem=True), FASHION_28PX)
    with pytest.raises(RecipeError, match="model_kwargs .* do not build timm's 'resnet18'"):
        build_teacher(TeacherConfig(model="resnet18", model_kwargs={"widht": 3}), FASHION_28PX)
    with pytest.raises(RecipeError, match="model_kwargs .*may not set in_chans"):
        load_recipe("recipes/fashion_mnist.yaml", ["distill.type=hard", "distill.teacher.model=resnet18",
                                                     "distill.teacher.model_kwargs={in_chans: 3}"])
    path = save_model(tiny_vit(), tmp_path / "teacher.safetensors")
    with pytest.raises(RecipeError, match="finished vitkit model"):
        load_recipe("recipes/fashion_mnist.yaml", ["distill.type=hard", f"distill.teacher.file={path}",
                                                     "distill.teacher.small_input_stem=true"])


def test_a_timm_teacher_loads_another_runs_weights_after_its_names_and_shapes_are_checked(tmp_path: Path) -> None:
    config = TeacherConfig(model="resnet18", small_input_stem=True, model_kwargs={"layers": [1, 1, 1, 1]})
    trained = build_teacher(config, FASHION_28PX)
    for value in trained.state_dict().values():
        if value.is_floating_point():
            value.normal_()  # weights no fresh build has
    path = tmp_path / TEACHER_FILE
    save_file({key: value.contiguous() for key, value in trained.state_dict().items()}, path)
    loaded = build_teacher(config.replace(file=str(path)), FASHION_28PX)
    for key, value in trained.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], value), key
    with pytest.raises(RecipeError, match=r"holds no weights of the teacher .*layer1.1.conv1.weight missing"):
        build_teacher(TeacherConfig(model="resnet18", small_input_stem=True, file=str(path)), FASHION_28PX)
    with pytest.raises(RecipeError, match=r"conv1.weight is \[64, 1, 3, 3\], the model needs \[64, 1, 7, 7\]"):
        build_teacher(config.replace(small_input_stem=False, file=str(path)), FASHION_28PX)
    path.write_bytes(b"\x08" + bytes(7) + b"not json")
    with pytest.raises(RecipeError, match="no readable safetensors file"):
        build_teacher(config.replace(file=str(path)), FASHION_28PX)


def test_a_teacher_that_cannot_take_the_data_or_is_too_large_is_refused_before_it_is_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vitkit.train import distill

    recipe = tiny_recipe(tmp_path, **SHORT)  # 8x8 digits
    recipe["distill"] = {"type": "hard", "teacher": {"model": "vit_tiny_patch16_224"}}  # a fixed 224-px ViT
    with pytest.raises(RecipeError, match=r"teacher.model 'vit_tiny_patch16_224' cannot take the data's 8x8 images"):
        train(recipe)
    assert not (tmp_path / "tiny").exists()  # refused before a run directory was claimed
    built: list[torch.device] = []
    real = timm.create_model

    def spy(*args, **kwargs):
        model = real(*args, **kwargs)
        built.append(next(model.parameters()).device)
        return model

    monkeypatch.setattr(distill.timm, "create_model", spy)
    monkeypatch.setattr(distill, "MAX_PARAMETERS", 1_000)
    recipe["distill"]["teacher"]["model"] = "test_resnet"
    with pytest.raises(RecipeError, match=r"teacher.model 'test_resnet' has [\d,]+ parameters, more than vitkit builds"):
        train(recipe)
    assert built and all(device.type == "meta" for device in built)  # nothing was allocated
