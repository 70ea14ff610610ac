"""A merged model is one graph for ``torch.compile``: Dynamo traces its whole forward with
``fullgraph=True`` (a host read such as ``.item()``, a branch on the data or an untraceable call in
the matching, the merge or the proportional-attention bias would break the graph and fail here), and
the traced forward gives the eager logits. docs/results.md measures what compiling buys a merged
model at batch 1."""

from __future__ import annotations

import torch

import vitkit
from vitkit import VisionTransformer, ViTConfig


def test_a_merged_model_compiles_as_one_graph_with_the_eager_logits() -> None:
    torch.manual_seed(0)
    # LSA's forbidden diagonal on top of log(size), merged positions rotating the keys (RoPE), a protected register
    config = ViTConfig(img_size=16, patch_size=4, embed_dim=32, depth=3, num_heads=4, num_classes=5, mlp_ratio=2.0,
                       locality=True, rope="axial", reg_tokens=1)
    model = vitkit.merge_tokens(VisionTransformer(config).eval(), [6, 2, 0])
    images = torch.randn(1, 3, 16, 16)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="eager", fullgraph=True, dynamic=False)
    with torch.inference_mode():
        eager = model(images)
        traced = compiled(images)
    assert eager.shape == (1, 5)
    torch.testing.assert_close(traced, eager, atol=1e-6, rtol=1e-6)
