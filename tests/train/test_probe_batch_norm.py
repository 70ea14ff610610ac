"""``model.head_bn``: MAE's linear probe puts ``BatchNorm1d(affine=False, eps=1e-6)`` between the
frozen encoder's pooled features and the new classifier (He et al. 2021, arXiv 2111.06377;
facebookresearch/mae ``main_linprobe.py``: ``model.head = Sequential(BatchNorm1d(..., affine=False,
eps=1e-6), model.head)``). Expected values are BatchNorm's formula written out here."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_finetune import TINY, built, finetune_recipe, tiny_weights

from vitkit import load_model
from vitkit.models import ViTConfig
from vitkit.models.timm_interop import timm_twin_lacks
from vitkit.schema import ConfigError
from vitkit.train import RecipeError, train


def test_the_classifiers_input_is_normalised_per_feature_over_the_batch_in_training_mode(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_classes=0)  # an encoder: the probe's classifier is new
    model = built(finetune_recipe(tmp_path, str(path), freeze="backbone", head_bn=True)).model.train()
    assert not any(param.requires_grad for name, param in model.named_parameters() if not name.startswith("head."))
    seen: list[torch.Tensor] = []
    model.head.register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    images = torch.randn(6, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    model(images)
    pooled = model.forward_head(model.forward_features(images), pre_logits=True).detach()
    mean, var = pooled.mean(dim=0), pooled.var(dim=0, unbiased=False)
    torch.testing.assert_close(seen[0], (pooled - mean) / torch.sqrt(var + 1e-6))
    # the running statistics move from (0, 1) by BatchNorm's momentum of 0.1, with the unbiased variance
    torch.testing.assert_close(model.head_bn.running_mean, 0.1 * mean)
    torch.testing.assert_close(model.head_bn.running_var, 0.9 + 0.1 * pooled.var(dim=0, unbiased=True))
    model.eval()
    seen.clear()
    model(images)
    stats = model.head_bn
    torch.testing.assert_close(seen[0], (pooled - stats.running_mean) / torch.sqrt(stats.running_var + 1e-6))


def test_a_probe_run_exports_a_model_that_holds_the_batch_norm_and_reloads_it(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path, num_classes=3)
    result = train(finetune_recipe(tmp_path, str(path), freeze="backbone", head_bn=True))
    exported = result.run_dir / "model.safetensors"
    loaded = load_model(exported).eval()
    assert loaded.config.head_bn and isinstance(loaded.head_bn, torch.nn.BatchNorm1d)
    assert loaded.head_bn.num_batches_tracked.item() > 0
    assert not torch.allclose(loaded.head_bn.running_mean, torch.zeros(32))  # the probe's statistics, saved
    source = load_model(path).state_dict()
    for key, value in source.items():
        if not key.startswith("head."):
            assert torch.equal(loaded.state_dict()[key], value), key  # the backbone stayed frozen
    images = torch.randn(4, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(images), result.model.eval()(images))
    # fine-tuned again, the model keeps its batch norm and statistics, a named variant's default too
    again = built(finetune_recipe(tmp_path, str(exported), name="vit_cifar_tiny", **TINY)).model
    assert again.config.head_bn
    torch.testing.assert_close(again.head_bn.running_var, loaded.head_bn.running_var)


def test_keeping_a_classifier_across_an_added_batch_norm_is_refused(tmp_path: Path) -> None:
    path = tiny_weights(tmp_path)  # 10 classes, as the digits: the classifier would be kept
    with pytest.raises(RecipeError, match=r"head_bn added: it was trained on other features; reset the head"):
        built(finetune_recipe(tmp_path, str(path), head_bn=True, reset_head=False))
    assert built(finetune_recipe(tmp_path, str(path), head_bn=True)).model.config.head_bn


def test_a_distilled_model_and_timm_refuse_the_batch_norm() -> None:
    with pytest.raises(ConfigError, match=r"head_bn .*cannot be set with distilled=True"):
        ViTConfig(img_size=8, patch_size=2, embed_dim=32, depth=1, num_heads=2, distilled=True, head_bn=True).validate()
    gaps = timm_twin_lacks(ViTConfig(img_size=8, patch_size=2, embed_dim=32, depth=1, num_heads=2, head_bn=True))
    assert [gap.fix for gap in gaps] == [{"head_bn": False}]
