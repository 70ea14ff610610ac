"""MAE (``vitkit.tasks.mae``): masking, decoder and loss as facebookresearch/mae computes them (their
``random_masking``, ``patchify``, ``forward_decoder`` and ``forward_loss`` written out below from ``models_mae.py``),
the loss on masked patches only, the encoder on the visible patches, and pixel targets in the
model's own patch order."""

from __future__ import annotations

import pytest
import torch

from vitkit.models import VisionTransformer, ViTConfig
from vitkit.schema import FieldError
from vitkit.tasks.mae import (
    MaeOptions,
    MaeTask,
    decoder_weights,
    masked_patch_loss,
    patchify,
    pixel_targets,
    random_masking,
    unpatchify,
)


# --- facebookresearch/mae, models_mae.py (MaskedAutoencoderViT), with the noise passed in -------------
def mae_random_masking(x: torch.Tensor, mask_ratio: float, noise: torch.Tensor):
    N, L, D = x.shape  # noqa: N806 - MAE's names
    len_keep = int(L * (1 - mask_ratio))
    ids_shuffle = torch.argsort(noise, dim=1)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :len_keep]
    x_masked = torch.gather(x, dim=1, index=ids_keep.unsqueeze(-1).repeat(1, 1, D))
    mask = torch.ones([N, L], device=x.device)
    mask[:, :len_keep] = 0
    mask = torch.gather(mask, dim=1, index=ids_restore)
    return x_masked, mask, ids_restore, ids_keep


def mae_patchify(imgs: torch.Tensor, p: int) -> torch.Tensor:
    h = w = imgs.shape[2] // p
    c = imgs.shape[1]
    x = imgs.reshape(shape=(imgs.shape[0], c, h, p, w, p))
    x = torch.einsum("nchpwq->nhwpqc", x)
    return x.reshape(shape=(imgs.shape[0], h * w, p**2 * c))


def mae_forward_loss(imgs: torch.Tensor, pred: torch.Tensor, mask: torch.Tensor, p: int, norm_pix_loss: bool):
    target = mae_patchify(imgs, p)
    if norm_pix_loss:
        mean = target.mean(dim=-1, keepdim=True)
        var = target.var(dim=-1, keepdim=True)
        target = (target - mean) / (var + 1.e-6) ** .5
    loss = (pred - target) ** 2
    loss = loss.mean(dim=-1)
    loss = (loss * mask).sum() / mask.sum()
    return loss


def mae_forward_decoder(decoder, x: torch.Tensor, ids_restore: torch.Tensor) -> torch.Tensor:
    """``forward_decoder``, on vitkit's decoder's parts (``decoder_embed`` is ``embed``, ``decoder_pred``
    is ``pred``, ...), for an encoder with a class token."""
    x = decoder.embed(x)
    mask_tokens = decoder.mask_token.repeat(x.shape[0], ids_restore.shape[1] + 1 - x.shape[1], 1)
    x_ = torch.cat([x[:, 1:, :], mask_tokens], dim=1)  # no cls token
    x_ = torch.gather(x_, dim=1, index=ids_restore.unsqueeze(-1).repeat(1, 1, x.shape[2]))  # unshuffle
    x = torch.cat([x[:, :1, :], x_], dim=1)  # append cls token
    x = x + decoder.pos_embed
    for blk in decoder.blocks:
        x = blk(x)
    x = decoder.norm(x)
    x = decoder.pred(x)
    x = x[:, 1:, :]
    return x
# ------------------------------------------------------------------------------------------------------


def encoder(**changes: object) -> VisionTransformer:
    fields = dict(img_size=8, patch_size=2, in_chans=3, num_classes=0, embed_dim=32, depth=2, num_heads=2, mlp_ratio=2.0)
    return VisionTransformer(ViTConfig(**{**fields, **changes})).eval()


def small_task(model: VisionTransformer, **options: object) -> MaeTask:
    return MaeTask(model.config, MaeOptions(**{"decoder_depth": 1, "decoder_dim": 16, "decoder_heads": 2, **options}))


@pytest.mark.parametrize("ratio", [0.75, 0.5, 0.3])
def test_masking_equals_maes_random_masking_for_the_same_noise(ratio: float) -> None:
    noise = torch.rand(5, 49)
    keep, mask, restore = random_masking(noise, ratio)
    tokens = torch.randn(5, 49, 3)
    x_masked, ref_mask, ref_restore, ref_keep = mae_random_masking(tokens, ratio, noise)
    assert torch.equal(keep, ref_keep) and torch.equal(mask, ref_mask) and torch.equal(restore, ref_restore)
    # the encoder's visible tokens are MAE's x_masked: vitkit's keep gathers the same rows in the same order
    assert torch.equal(tokens.gather(1, keep.unsqueeze(-1).expand(-1, -1, 3)), x_masked)


def test_masking_keeps_exactly_the_count_and_the_lowest_noise_positions() -> None:
    noise = torch.rand(4, 16)
    keep, mask, _ = random_masking(noise, 0.75)
    assert keep.shape == (4, 4)
    assert mask.sum(dim=1).tolist() == [12.0] * 4
    for row in range(4):
        lowest = set(noise[row].argsort()[:4].tolist())
        assert set(keep[row].tolist()) == lowest  # the 4 patches of lowest noise stay
        assert set(torch.nonzero(mask[row] == 0).flatten().tolist()) == lowest  # and only they are unmasked


def test_the_encoder_sees_only_the_kept_patches_with_their_positions() -> None:
    model = encoder(reg_tokens=2)
    task = small_task(model)
    images = torch.randn(3, 3, 8, 8)
    noise = torch.rand(3, 16)
    latent, mask, _ = task.encode(model, images, noise)
    assert latent.shape == (3, model.num_prefix_tokens + 4, 32)
    keep = random_masking(noise, 0.75)[0]
    tokens, _ = model.embed(images)  # every token with its position embedding
    seen, _ = model.embed(images, keep=keep)
    prefix = model.num_prefix_tokens
    assert torch.equal(seen[:, prefix:], tokens[:, prefix:].gather(1, keep.unsqueeze(-1).expand(-1, -1, 32)))


@pytest.mark.parametrize("norm_pix_loss", [True, False])
def test_the_loss_equals_maes_forward_loss(norm_pix_loss: bool) -> None:
    model = encoder()
    task = small_task(model, norm_pix_loss=norm_pix_loss)
    images = torch.randn(3, 3, 8, 8)
    noise = torch.rand(3, 16)
    prediction, _, mask = task.reconstruct(model, images, noise)
    reference = mae_forward_loss(images, prediction, mask, 2, norm_pix_loss)
    assert torch.allclose(task.loss(model, images, noise), reference, rtol=1e-6, atol=0)


def test_the_decoder_equals_maes_forward_decoder_in_image_order() -> None:
    """The prediction is MAE's on the same encoder tokens and ``ids_restore``: patch ``i`` of the
    prediction is grid cell ``i``'s, whatever order the encoder saw the visible patches in."""
    torch.manual_seed(0)
    model = encoder()
    task = small_task(model, decoder_depth=2)
    with torch.no_grad():
        task.decoder.mask_token.normal_()  # the mask token apart from the visible tokens
    images, noise = torch.randn(3, 3, 8, 8), torch.rand(3, 16)
    latent, _, restore = task.encode(model, images, noise)
    assert not torch.equal(restore, torch.arange(16).expand(3, -1))  # the visible patches come shuffled
    with torch.no_grad():
        prediction = task.reconstruct(model, images, noise)[0]
        torch.testing.assert_close(prediction, mae_forward_decoder(task.decoder, latent, restore), rtol=1e-5, atol=1e-6)


def test_the_loss_counts_masked_patches_only() -> None:
    prediction, target = torch.randn(2, 16, 12), torch.randn(2, 16, 12)
    mask = random_masking(torch.rand(2, 16), 0.75)[1]
    before = masked_patch_loss(prediction, target, mask)
    visible, hidden = (torch.nonzero(mask[0] == value)[0, 0] for value in (0, 1))
    changed = target.clone()
    changed[0, visible] += 10.0
    assert torch.equal(masked_patch_loss(prediction, changed, mask), before)
    changed = target.clone()
    changed[0, hidden] += 10.0
    assert masked_patch_loss(prediction, changed, mask) > before + 1.0


def test_a_visible_patchs_pixels_reach_the_loss_only_through_the_encoder() -> None:
    """Changing a visible patch's target pixels changes nothing but what the encoder sees: with
    the decoder's prediction held, the loss is the same."""
    model = encoder()
    task = small_task(model, norm_pix_loss=False)
    images = torch.randn(1, 3, 8, 8)
    noise = torch.rand(1, 16)
    prediction, target, mask = task.reconstruct(model, images, noise)
    cell = int(torch.nonzero(mask[0] == 0)[0, 0])
    row, col = divmod(cell, 4)
    moved = images.clone()
    moved[:, :, 2 * row : 2 * row + 2, 2 * col : 2 * col + 2] += 5.0
    moved_target = pixel_targets(patchify(moved, (2, 2)), False)
    assert not torch.equal(moved_target, target)
    assert torch.equal(masked_patch_loss(prediction, moved_target, mask), masked_patch_loss(prediction, target, mask))


@pytest.mark.parametrize("changes", [{}, {"reg_tokens": 2}, {"class_token": False, "global_pool": "avg", "fc_norm": False},
                                     {"rope": "axial", "num_heads": 2}])
def test_the_encoder_at_mask_ratio_0_equals_the_plain_forward(changes: dict) -> None:
    model = encoder(**changes)
    task = small_task(model)
    task.mask_ratio = 0.0  # the encoding path alone: MaeOptions refuses a ratio that hides nothing to learn from
    size = model.config.img_size[0]
    images = torch.randn(2, 3, size, size)
    latent, mask, restore = task.encode(model, images)
    plain = model.forward_features(images)
    prefix = model.num_prefix_tokens
    assert mask.sum() == 0
    unshuffled = latent[:, prefix:].gather(1, restore.unsqueeze(-1).expand(-1, -1, latent.shape[-1]))
    assert torch.allclose(latent[:, :prefix], plain[:, :prefix], atol=1e-5)
    assert torch.allclose(unshuffled, plain[:, prefix:], atol=1e-5)


def test_pixel_targets_are_the_patches_the_model_embeds_in_its_order() -> None:
    model = encoder()
    images = torch.randn(2, 3, 8, 8)
    patches = patchify(images, (2, 2))
    assert torch.equal(patches, mae_patchify(images, 2))
    # the linear patch embedding is a Linear over exactly these vectors, token by token
    assert torch.allclose(model.patch_embed.proj(patches), model.patch_embed(images), atol=1e-6)


#: Tokenizers whose receptive field crosses patch borders: MAE must refuse them.
MIXING_TOKENIZERS = [{"patch_embed": "conv", "patch_size": 4, "img_size": 16}, {"shifted_patches": True}]


@pytest.mark.parametrize("changes", [{}, {"reg_tokens": 2, "rope": "axial"}, {"pos_drop_rate": 0.0, "pre_norm": True},
                                     *MIXING_TOKENIZERS])
def test_a_hidden_patchs_pixels_never_reach_the_encoders_tokens(changes: dict) -> None:
    """Every encoder MAE accepts gives bit-identical tokens when only the hidden patches' pixels
    change (in training mode, so batch statistics count too); the others are refused."""
    model = encoder(**changes).train()
    try:
        task = small_task(model)
    except FieldError:
        assert changes in MIXING_TOKENIZERS
        return
    size, (p, _) = model.config.img_size[0], model.config.patch_size
    images, noise = torch.randn(2, 3, size, size), torch.rand(2, (size // p) ** 2)
    latent, mask, _ = task.encode(model, images, noise)
    hidden = mask.unsqueeze(-1).expand(-1, -1, p * p * 3)  # 1 on every pixel of a hidden patch
    hidden_pixels = unpatchify(hidden, (p, p), (size // p, size // p))
    changed = images + 10.0 * torch.randn_like(images) * hidden_pixels
    assert not torch.equal(changed, images)
    assert torch.equal(task.encode(model, changed, noise)[0], latent)


@pytest.mark.parametrize("changes", MIXING_TOKENIZERS)
def test_a_tokenizer_that_mixes_patches_is_refused(changes: dict) -> None:
    key = next(iter(changes))
    with pytest.raises(FieldError, match=f"^model.{key} .*hidden pixels reach the visible tokens"):
        small_task(encoder(**changes))


def test_the_loss_trains_encoder_and_decoder_and_the_decoder_is_the_tasks_own() -> None:
    model = encoder().train()
    task = small_task(model)
    task.loss(model, torch.randn(4, 3, 8, 8)).backward()
    assert model.patch_embed.proj.weight.grad is not None and model.patch_embed.proj.weight.grad.abs().sum() > 0
    assert task.decoder.mask_token.grad.abs().sum() > 0
    assert "decoder.mask_token" in task.state_dict() and "decoder.pos_embed" not in task.state_dict()


def test_evaluation_uses_the_same_masks_every_time() -> None:
    model = encoder()
    task = small_task(model)
    batch = (torch.randn(4, 3, 8, 8), torch.zeros(4))
    assert torch.equal(task.evaluation_step(model, batch, "val").loss, task.evaluation_step(model, batch, "val").loss)


def test_figure_rows_put_the_input_where_visible() -> None:
    model = encoder()
    task = small_task(model)
    images = torch.randn(2, 3, 8, 8)
    rows = task.figure_rows(model, images)
    assert set(rows) == {"masked", "reconstruction", "original"}
    visible = rows["masked"] != 0
    assert torch.equal(rows["reconstruction"][visible], images[visible])
    assert (rows["masked"] == 0).float().mean().item() == pytest.approx(0.75)


def test_a_ratio_that_leaves_no_patch_visible_is_refused() -> None:
    with pytest.raises(ValueError, match="no visible patch"):
        MaeTask(encoder().config, MaeOptions(mask_ratio=0.95))


@pytest.mark.parametrize(("patch", "chans", "dim", "depth"), [(2, 3, 16, 1), (4, 1, 64, 2), (1, 3, 24, 3)])
def test_the_decoders_counted_weights_are_its_parameters(patch: int, chans: int, dim: int, depth: int) -> None:
    model = encoder(patch_size=patch, in_chans=chans)
    task = small_task(model, decoder_dim=dim, decoder_depth=depth)
    counted = decoder_weights(model.config.embed_dim, patch * patch * chans, dim=dim, depth=depth)
    assert counted == sum(p.numel() for p in task.decoder.parameters())
