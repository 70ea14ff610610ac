"""The authors' AttnLRP for vision transformers, as ``lxt`` ships it: torchvision's ViT patched by
``lxt.efficient.monkey_patch`` (CP-LRP in the attention, identity rules on LayerNorm and GELU)
with ``zennit``'s gamma rule on its convolution and linear layers (``lxt``'s
``examples/vit_torch.py``), run on a torchvision twin of a vitkit model with the same weights.

``lxt`` patches ``torch.nn`` classes process-wide, so :func:`lxt_relevance` restores them before
it returns; run nothing else in between.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torchvision.models import vision_transformer

import vitkit


def twin_problem(model: vitkit.VisionTransformer) -> str | None:
    """Why ``model`` has no torchvision twin (``None``: it has one). torchvision's ViT is the
    original: linear patches, learned positions, one class token read out, exact GELU, LayerNorms
    before each branch, the same heads in every block, square images and patches, 1 or 3 channels."""
    config = model.config
    heads = model.heads_per_layer()
    checks = {
        "a conv stem or shifted patches": config.patch_embed == "linear" and not config.shifted_patches,
        "LSA (locality)": not config.locality,
        "another read-out than one class token": config.class_token and config.global_pool == "token"
        and not config.distilled and config.reg_tokens == 0 and not config.use_fc_norm,
        "positions other than a learned table": config.resolved_pos_embed == "learn" and config.rope == "none"
        and not config.no_embed_class,
        "qk-norm, LayerScale, another activation or a norm before the blocks": not config.qk_norm
        and config.init_values is None and config.act_layer == "gelu" and not config.pre_norm,
        "qkv without bias or pruned heads": config.qkv_bias and len(set(heads)) == 1 and heads[0] > 0,
        "non-square images or patches, or other than 1 or 3 channels": config.img_size[0] == config.img_size[1]
        and config.patch_size[0] == config.patch_size[1] and config.in_chans in (1, 3),
    }
    return next((f"torchvision's ViT has no {name}" for name, fits in checks.items() if not fits), None)


def torchvision_twin(model: vitkit.VisionTransformer) -> vision_transformer.VisionTransformer:
    """torchvision's ``VisionTransformer`` with ``model``'s weights (:func:`twin_problem` says which
    models have one), in eval mode and ``model``'s dtype. A grayscale model's twin takes the image repeated on 3
    channels, its patch weights split evenly among them (the same logits, and the same relevance
    summed over channels)."""
    problem = twin_problem(model)
    if problem is not None:
        raise ValueError(problem)
    config = model.config
    size, patch = config.img_size[0], config.patch_size[0]
    twin = vision_transformer.VisionTransformer(
        image_size=size, patch_size=patch, num_layers=config.depth, num_heads=model.blocks[0].attn.num_heads,
        hidden_dim=config.embed_dim, mlp_dim=model.blocks[0].mlp.fc1.out_features, num_classes=config.num_classes,
    ).to(model.pos_embed.dtype)  # in the model's dtype: a float64 model's split patch weights stay exact
    dim = config.embed_dim
    state = {
        "class_token": model.cls_token,
        "conv_proj.weight": model.patch_embed.proj.weight.reshape(dim, patch, patch, config.in_chans)
        .permute(0, 3, 1, 2).expand(dim, 3, patch, patch) / (3 // config.in_chans),
        "conv_proj.bias": model.patch_embed.proj.bias,
        "encoder.pos_embedding": model.pos_embed,
        "encoder.ln.weight": model.norm.weight, "encoder.ln.bias": model.norm.bias,
        "heads.head.weight": model.head.weight, "heads.head.bias": model.head.bias,
    }
    for index, block in enumerate(model.blocks):
        prefix = f"encoder.layers.encoder_layer_{index}."
        for ours, theirs in (("norm1", "ln_1"), ("norm2", "ln_2"), ("attn.proj", "self_attention.out_proj"),
                             ("mlp.fc1", "mlp.0"), ("mlp.fc2", "mlp.3")):
            module = block.get_submodule(ours)
            state[f"{prefix}{theirs}.weight"], state[f"{prefix}{theirs}.bias"] = module.weight, module.bias
        state[f"{prefix}self_attention.in_proj_weight"] = block.attn.qkv.weight
        state[f"{prefix}self_attention.in_proj_bias"] = block.attn.qkv.bias
    twin.load_state_dict({key: value.detach().clone() for key, value in state.items()})
    return twin.eval()


def lxt_relevance(
    twin: vision_transformer.VisionTransformer, images: torch.Tensor, targets: torch.Tensor,
    linear_gamma: float, conv_gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``lxt``'s relevance ``[B, H, W]`` (input x gradient summed over channels) of ``twin`` for
    ``targets``, and the twin's logits ``[B, K]``, with the ``torch.nn`` classes restored after."""
    import zennit.rules
    from lxt.efficient import monkey_patch, monkey_patch_zennit
    from zennit.composites import LayerMapComposite
    from zennit.core import BasicHook

    patched = (nn.GELU, nn.LayerNorm, nn.MultiheadAttention)
    saved = {cls: cls.__dict__["forward"] for cls in patched}
    saved_hook = {name: BasicHook.__dict__[name] for name in ("forward", "backward")}
    composite = LayerMapComposite([(nn.Conv2d, zennit.rules.Gamma(conv_gamma)), (nn.Linear, zennit.rules.Gamma(linear_gamma))])
    try:
        monkey_patch(vision_transformer)
        monkey_patch_zennit()
        for parameter in twin.parameters():
            parameter.requires_grad_(False)
        composite.register(twin)
        inputs = images.expand(-1, 3, -1, -1).clone().requires_grad_(True)  # grayscale: on 3 channels
        logits = twin(inputs)
        logits.gather(1, targets[:, None]).sum().backward()
        relevance = (inputs * inputs.grad).sum(1)
    finally:
        composite.remove()
        for cls, forward in saved.items():
            cls.forward = forward
            if "original_forward" in cls.__dict__:
                delattr(cls, "original_forward")
        for name, method in saved_hook.items():
            setattr(BasicHook, name, method)
    return relevance.detach(), logits.detach()
