"""facebookresearch/ToMe's merging, written out from ``tome/merge.py``, ``tome/patch/timm.py`` and
``tome/utils.py`` (Bolya et al. 2022, arXiv 2210.09461): the reference vitkit's token merging is
tested against."""

from __future__ import annotations

import math

import torch
from timm.models.vision_transformer import Attention, Block


def do_nothing(x, mode=None):
    return x


def tome_bipartite_soft_matching(metric, r, class_token=False, distill_token=False):
    protected = int(class_token) + int(distill_token)
    t = metric.shape[1]
    r = min(r, (t - protected) // 2)
    if r <= 0:
        return do_nothing, do_nothing
    with torch.no_grad():
        metric = metric / metric.norm(dim=-1, keepdim=True)
        a, b = metric[..., ::2, :], metric[..., 1::2, :]
        scores = a @ b.transpose(-1, -2)
        if class_token:
            scores[..., 0, :] = -math.inf
        if distill_token:
            scores[..., :, 0] = -math.inf
        node_max, node_idx = scores.max(dim=-1)
        edge_idx = node_max.argsort(dim=-1, descending=True)[..., None]
        unm_idx = edge_idx[..., r:, :]
        src_idx = edge_idx[..., :r, :]
        dst_idx = node_idx[..., None].gather(dim=-2, index=src_idx)
        if class_token:
            unm_idx = unm_idx.sort(dim=1)[0]

    def merge(x, mode="mean"):
        src, dst = x[..., ::2, :], x[..., 1::2, :]
        n, t1, c = src.shape
        unm = src.gather(dim=-2, index=unm_idx.expand(n, t1 - r, c))
        src = src.gather(dim=-2, index=src_idx.expand(n, r, c))
        dst = dst.scatter_reduce(-2, dst_idx.expand(n, r, c), src, reduce=mode)
        if distill_token:
            return torch.cat([unm[:, :1], dst[:, :1], unm[:, 1:], dst[:, 1:]], dim=1)
        return torch.cat([unm, dst], dim=1)

    return merge, None


def tome_merge_wavg(merge, x, size=None):
    if size is None:
        size = torch.ones_like(x[..., 0, None])
    x = merge(x * size, mode="sum")
    size = merge(size, mode="sum")
    return x / size, size


def tome_merge_source(merge, x, source=None):
    if source is None:
        n, t, _ = x.shape
        source = torch.eye(t, device=x.device)[None, ...].expand(n, t, t)
    return merge(source, mode="amax")


def tome_parse_r(num_layers, r):
    inflect = 0
    if isinstance(r, list):
        return r + [0] * (num_layers - len(r))
    if isinstance(r, tuple):
        r, inflect = r
    min_val = int(r * (1.0 - inflect))
    max_val = 2 * r - min_val
    step = (max_val - min_val) / (num_layers - 1)
    return [int(min_val + step * i) for i in range(num_layers)]


class ToMeBlock(Block):
    """ToMe's ``ToMeBlock`` on today's timm ``Block`` (whose LayerScale, absent from ToMe's timm, is
    applied as the block applies it)."""

    def forward(self, x):
        attn_size = self._tome_info["size"] if self._tome_info["prop_attn"] else None
        x_attn, metric = self.attn(self.norm1(x), attn_size)
        x = x + self.drop_path1(self.ls1(x_attn))
        r = self._tome_info["r"].pop(0)
        if r > 0:
            merge, _ = tome_bipartite_soft_matching(
                metric, r, self._tome_info["class_token"], self._tome_info["distill_token"]
            )
            if self._tome_info["trace_source"]:
                self._tome_info["source"] = tome_merge_source(merge, x, self._tome_info["source"])
            x, self._tome_info["size"] = tome_merge_wavg(merge, x, self._tome_info["size"])
        return x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))


class ToMeAttention(Attention):
    def forward(self, x, size=None):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q @ k.transpose(-2, -1)) * self.scale
        if size is not None:
            attn = attn + size.log()[:, None, None, :, 0]
        attn = attn.softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x), k.mean(1)


def tome_apply_patch(model, r, trace_source=True, prop_attn=True):
    base = model.__class__

    class ToMeVisionTransformer(base):
        def forward(self, *args, **kwargs):
            self._tome_info["r"] = tome_parse_r(len(self.blocks), self.r)
            self._tome_info["size"] = None
            self._tome_info["source"] = None
            return super().forward(*args, **kwargs)

    model.__class__ = ToMeVisionTransformer
    model.r = r
    model._tome_info = {
        "r": r, "size": None, "source": None, "trace_source": trace_source, "prop_attn": prop_attn,
        "class_token": model.cls_token is not None,
        "distill_token": getattr(model, "dist_token", None) is not None,
    }
    for module in model.modules():
        if isinstance(module, Block):
            module.__class__ = ToMeBlock
            module._tome_info = model._tome_info
        elif isinstance(module, Attention):
            module.__class__ = ToMeAttention
    return model
