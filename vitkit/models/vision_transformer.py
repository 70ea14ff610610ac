"""Vision Transformer (Dosovitskiy et al. 2021, https://arxiv.org/abs/2010.11929).

Composes the blocks of :mod:`vitkit.layers`: patch embedding, prefix tokens (class token, DeiT's
distillation token, registers), position embedding (absolute, rotary or both), an optional
pre-norm (CLIP), a stack of
pre-norm encoder blocks with a linear stochastic-depth ramp, final norm, pooling (class token,
mean of the patches, or SigLIP's attention pooling) and a linear head (two with distillation).
State-dict keys follow timm's ``VisionTransformer`` except the patch projection, which is a
``Linear`` over ``(p1 p2 c)``-ordered patches (see :mod:`.timm_interop`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Literal

import torch
from timm.layers import AttentionPoolLatent, get_act_layer
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..layers import ConvPatchEmbed, PatchEmbed, TokenPositions, get_part, resample_pos_embed, sincos_2d_pos_embed
from ..layers.init_rules import reset_submodules
from ..layers.token_merging import MergeState, MergeStep, check_mergeable, unmerge_tokens
from .config import ViTConfig
from .init import TOKEN_STD, init_parts

#: Per-block head gates: ``None``, or one ``None`` / ``[H_l]`` / ``[B, H_l]`` entry per block (a
#: ``[depth, H]`` tensor works when all layers have ``H`` heads).
HeadGates = torch.Tensor | Sequence[torch.Tensor | None] | None


@dataclass
class Intermediates:
    """What :meth:`VisionTransformer.forward_intermediates` returns.

    Attributes:
        features: ``[B, N, D]`` tokens after the last block and the final norm (the input of
            :meth:`~VisionTransformer.forward_head`); ``None`` with ``intermediates_only``, or
            when ``stop_early`` stopped before the last block.
        intermediates: per chosen block, its patch tokens ``[B, D, gh, gw]`` (NCHW) or
            ``[B, gh*gw, D]`` (NLC).
        prefix_tokens: per chosen block, its ``[B, num_prefix_tokens, D]`` tokens, or ``None``
            unless ``return_prefix_tokens``.
        attentions: per chosen block, its post-softmax weights ``[B, H_l, N, N]`` (a block with
            every head pruned gives ``[B, 0, N, N]``, outside the graph), or ``None`` unless
            ``return_attention``. With token merging, ``N`` is the tokens the block attends over.
        indices: the chosen blocks, ascending.
        sources: with token merging, per chosen block, ToMe's source matrix ``[B, N, N0]`` of the
            tokens it attends over (which of the first block's ``N0`` tokens each holds:
            :func:`~vitkit.layers.token_merging.unmerge_attention` puts the weights back on the
            patches); ``None`` without. Merged patch tokens in ``intermediates`` are already
            back on the ``gh*gw`` grid, each patch with the features of the token that holds it.
    """

    features: torch.Tensor | None
    intermediates: list[torch.Tensor]
    prefix_tokens: list[torch.Tensor] | None
    attentions: list[torch.Tensor] | None
    indices: list[int]
    sources: list[torch.Tensor] | None = None


def _take_indices(depth: int, indices: int | Sequence[int] | None) -> list[int]:
    """Ascending block indices that ``indices`` names, as timm's ``feature_take_indices`` reads
    them (``None`` all, ``n`` the last ``n``, negatives from the end), with a ``ValueError``
    rather than timm's assertion for one out of range."""
    if indices is None:
        return list(range(depth))
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ValueError(f"indices={indices} asks for the last {indices} blocks of {depth}; give 1 to {depth}.")
        return list(range(depth - indices, depth))
    if any(not -depth <= i < depth for i in indices):
        raise ValueError(f"block indices must lie in [-{depth}, {depth}), got {list(indices)}.")
    return sorted({i % depth for i in indices})


class VisionTransformer(nn.Module):
    """ViT classifier built from a :class:`ViTConfig` (or its fields as keyword arguments).

    Contract (as timm's): ``forward(x) -> [B, num_classes]`` logits, ``forward_features(x) ->``
    ``[B, N, D]`` tokens, ``forward_head(feats, pre_logits=False)``, ``forward_intermediates(x,``
    ``indices, ..., return_attention=False)`` for chosen blocks' tokens and attention weights
    (an :class:`Intermediates`), ``set_grad_checkpointing``, ``reset_classifier``,
    ``no_weight_decay``, ``group_matcher``. Every forward takes ``head_gates`` (per-block head gates).
    With ``config.merge_tokens`` (:func:`vitkit.merge_tokens`), every forward merges tokens
    between each block's attention and MLP (ToMe, :mod:`vitkit.layers.token_merging`).

    The blocks are ``config.block`` (a registered name, :mod:`vitkit.layers.parts`) built with
    ``config.attn_layer`` and ``config.mlp_layer``; ``block_fn`` overrides the block class for
    this instance (timm's ``block_fn``), but only a registered one is recorded in a model file.

    ``device`` and ``dtype`` are torch's factory keywords. To build a large model without memory
    or init cost, build it on the meta device, then ``model.to_empty(device=...)`` and
    ``model.reset_parameters()``, which draws the same init as construction.
    """

    def __init__(
        self,
        config: ViTConfig | None = None,
        *,
        block_fn: type[nn.Module] | None = None,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__()
        config = ViTConfig(**kwargs) if config is None else config.replace(**kwargs)
        factory = {"device": device, "dtype": dtype}
        self.config = config
        dim, depth = config.embed_dim, config.depth
        self.num_classes = config.num_classes
        self.embed_dim = dim
        self.num_prefix_tokens = config.num_prefix_tokens
        self.grad_checkpointing = False

        self.distilled_training = False
        self.patch_embed = (
            ConvPatchEmbed(config.patch_size, config.in_chans, dim, **factory)
            if config.patch_embed == "conv"
            else PatchEmbed(
                config.patch_size, config.in_chans, dim, shifted=config.shifted_patches, bias=not config.pre_norm,
                **factory,
            )
        )
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim, **factory)) if config.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, dim, **factory)) if config.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, config.reg_tokens, dim, **factory)) if config.reg_tokens else None
        if config.resolved_pos_embed == "learn":
            embed_len = config.num_pos_embed_prefix_tokens + config.num_patches
            self.pos_embed = nn.Parameter(torch.zeros(1, embed_len, dim, **factory))
        elif config.resolved_pos_embed == "none":  # positions come from RoPE alone (or not at all)
            self.pos_embed = None
        else:
            table = self._sincos(config.grid_size, device=device, dtype=dtype or torch.get_default_dtype())
            self.register_buffer("pos_embed", table, persistent=False)
        self.pos_drop = nn.Dropout(config.pos_drop_rate) if config.pos_drop_rate > 0 else nn.Identity()
        self.norm_pre = nn.LayerNorm(dim, eps=config.norm_eps, **factory) if config.pre_norm else nn.Identity()

        rates = torch.linspace(0, config.drop_path_rate, depth, device="cpu").tolist()  # CPU under a meta context too
        self.blocks = nn.ModuleList(
            build_block(config, heads, drop_path=rate, block_fn=block_fn, **factory)
            for heads, rate in zip(config.heads_per_layer(), rates)
        )
        use_fc_norm = config.use_fc_norm
        self.norm = nn.Identity() if use_fc_norm else nn.LayerNorm(dim, eps=config.norm_eps, **factory)
        self.attn_pool = self._attention_pool(config, **factory) if config.global_pool == "map" else nn.Identity()
        self.fc_norm = nn.LayerNorm(dim, eps=config.norm_eps, **factory) if use_fc_norm else nn.Identity()
        self.head_drop = nn.Dropout(config.drop_rate) if config.drop_rate > 0 else nn.Identity()
        self.head_bn = nn.BatchNorm1d(dim, eps=1e-6, affine=False, **factory) if config.head_bn else nn.Identity()
        self.head = nn.Linear(dim, config.num_classes, **factory) if config.num_classes > 0 else nn.Identity()
        with_dist_head = config.distilled and config.num_classes > 0
        self.head_dist = nn.Linear(dim, config.num_classes, **factory) if with_dist_head else nn.Identity()
        self.merge_schedule: list[int] = []
        self.set_token_merging(config.merge_tokens)
        self._init_weights()

    @staticmethod
    def _attention_pool(config: ViTConfig, **factory: Any) -> nn.Module:
        """SigLIP's attention-pooling head: timm's ``AttentionPoolLatent`` (one learned query
        attending over the patch tokens, then an MLP), built as timm's ``global_pool='map'``."""
        return AttentionPoolLatent(
            config.embed_dim,
            num_heads=config.pool_heads,
            mlp_ratio=config.mlp_ratio,
            norm_layer=partial(nn.LayerNorm, eps=config.norm_eps),
            act_layer=get_act_layer(config.act_layer),
            **factory,
        )

    def _init_weights(self) -> None:
        """Every Linear by the ``config.init`` scheme (see :mod:`.init`); position embedding and
        distillation token N(0, 0.02) truncated, class and register tokens by the scheme's
        :data:`~.init.TOKEN_STD` (timm's N(0, 1e-6), MAE's N(0, 0.02)).
        The attention pool keeps timm's own init of its latent query (its Linears torch's)."""
        init_parts(self, self.config.init)
        if isinstance(self.pos_embed, nn.Parameter):
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for token in (self.cls_token, self.reg_token):
            if token is not None:
                nn.init.normal_(token, std=TOKEN_STD[self.config.init])
        if self.dist_token is not None:
            nn.init.trunc_normal_(self.dist_token, std=0.02)
        if isinstance(self.attn_pool, AttentionPoolLatent):
            self.attn_pool.init_weights()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-draw every parameter as construction does, and refill the sin-cos table.

        Sub-modules are reset children before parents (LayerNorms, LayerScale, the layers' own
        inits), then the ``config.init`` scheme is applied on top, as at construction. This is the
        second step of meta-device building (after ``to_empty``), where nothing was initialised.
        """
        reset_submodules(self)
        self._init_weights()
        if self.config.resolved_pos_embed == "sincos":
            self.pos_embed.copy_(self._sincos(self.config.grid_size))

    def _sincos(
        self, grid: tuple[int, int], *, device: torch.device | str | None = None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """``[1, prefix + gh*gw, D]`` fixed table; the prefix rows are zero (none with ``no_embed_class``)."""
        table = sincos_2d_pos_embed(self.embed_dim, grid, device=device, dtype=dtype)
        prefix = table.new_zeros(self.config.num_pos_embed_prefix_tokens, self.embed_dim)
        return torch.cat([prefix, table], dim=0).unsqueeze(0)

    # ----------------------------------------------------------------------------------- API
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass (non-reentrant checkpointing):
        same outputs and gradients, far less activation memory."""
        self.grad_checkpointing = enable

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head with a fresh ``num_classes``-way one (0 = features only)."""
        self.num_classes = num_classes
        self.config = self.config.replace(
            num_classes=num_classes, global_pool=global_pool or self.config.global_pool
        )
        like = self.patch_embed.proj.weight
        self.head = (
            nn.Linear(self.embed_dim, num_classes, device=like.device, dtype=like.dtype)
            if num_classes > 0
            else nn.Identity()
        )
        if self.config.distilled:
            fresh = nn.Linear(self.embed_dim, num_classes, device=like.device, dtype=like.dtype)
            self.head_dist = fresh if num_classes > 0 else nn.Identity()
        init_parts(self, self.config.init, ["head"])

    def set_distilled_training(self, enable: bool = True) -> None:
        """With ``distilled``: in training mode, return both heads' logits ``(cls, dist)`` (the
        distillation head learns from a teacher), as timm's ``VisionTransformerDistilled``."""
        self.distilled_training = enable

    def no_weight_decay(self) -> set[str]:
        """Parameter names that should not be weight-decayed (besides norms and biases): the
        embeddings and prefix tokens, and the mixed-RoPE frequencies, as timm."""
        names = ("pos_embed", "cls_token", "reg_token", "dist_token")
        rope = {name for name, _ in self.named_parameters() if name.endswith(".rope.freqs")}
        return {name for name in names if isinstance(getattr(self, name), nn.Parameter)} | rope

    def group_matcher(self, coarse: bool = False) -> dict[str, Any]:
        """timm's contract for layer-wise groups (``timm.models.group_parameters``, behind
        ``param_groups_layer_decay`` and :func:`vitkit.train.freezing.freeze`): layer 0 is the stem
        (patch embedding with its conv stem, class, distillation and register tokens, position
        embedding, pre-norm), block ``i`` is layer ``i + 1``, the final ``norm`` joins the last block
        (timm's ``(99999,)`` suffix), and everything unmatched (``fc_norm``, ``attn_pool``, ``head``,
        ``head_dist``) is layer ``depth + 1``, as timm's ``VisionTransformer`` and DeiT. A block's
        mixed-RoPE frequencies (``blocks.i.attn.rope.freqs``) belong to its layer, unlike timm's
        Eva, whose one model-level frequency tensor is unmatched (layer ``depth + 1``).

        Args:
            coarse: timm's switch between coarse and fine groups; a ViT block is already the finest
                unit, so both give the same groups (as timm's ViT).

        Returns:
            group name to regular expression(s) over parameter names, in layer order.
        """
        return dict(
            stem=r"^(?:cls_token|reg_token|dist_token|pos_embed|patch_embed|norm_pre)",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm\.", (99999,))],
        )

    def set_token_merging(self, r: int | Sequence[int], prop_attn: bool | None = None) -> None:
        """Merge ``r`` tokens in every block (an int) or ``r[l]`` in block ``l`` (a list), 0 for
        none: ToMe between each block's attention and MLP, recorded in ``config.merge_tokens``
        (an inference option saved with the model, not a weight). :func:`vitkit.merge_tokens`
        also builds ToMe's schedules. ``prop_attn`` (ToMe's flag, ``config.merge_prop_attn``)
        switches proportional attention on or off; ``None`` keeps the model's setting.

        Raises:
            vitkit.schema.ConfigError: a count below 0, a list of another length than ``depth``,
                or more tokens than the first block can merge.
            ValueError: blocks other than vitkit's encoder block with its self-attention.
        """
        prop_attn = self.config.merge_prop_attn if prop_attn is None else prop_attn
        config = self.config.replace(merge_tokens=r if isinstance(r, int) else list(r), merge_prop_attn=prop_attn)
        schedule = config.merge_per_block()
        if any(schedule):
            for block in self.blocks:
                check_mergeable(block)
        self.config, self.merge_schedule = config, schedule if any(schedule) else []

    def heads_per_layer(self) -> list[int]:
        """Current head count of each block."""
        return [block.attn.num_heads for block in self.blocks]

    def load_weights(self, state_dict: dict[str, torch.Tensor], source_grid: tuple[int, int]) -> None:
        """Load ``state_dict`` (strict), bicubically resampling a learned ``pos_embed`` trained on
        a ``source_grid`` patch grid to this model's grid."""
        state = dict(state_dict)
        if isinstance(self.pos_embed, nn.Parameter) and "pos_embed" in state:
            state["pos_embed"] = resample_pos_embed(
                state["pos_embed"], self.config.grid_size, tuple(source_grid), self.config.num_pos_embed_prefix_tokens
            )
        elif not isinstance(self.pos_embed, nn.Parameter):
            state.pop("pos_embed", None)
        self.load_state_dict(state)

    # ------------------------------------------------------------------------------- forward
    def _position_embedding(self, grid: tuple[int, int]) -> torch.Tensor | None:
        if tuple(grid) == self.config.grid_size:
            return self.pos_embed
        if not self.config.dynamic_img_size:
            height, width = (g * p for g, p in zip(grid, self.config.patch_size))
            expected = self.config.img_size
            raise ValueError(
                f"input image size {height}x{width} differs from the model's img_size "
                f"{expected[0]}x{expected[1]}; resize the input, build the model with that img_size "
                "(weights are resampled on load), or set dynamic_img_size=True."
            )
        if self.pos_embed is None:
            return None
        if self.config.resolved_pos_embed == "sincos":
            return self._sincos(grid).to(self.pos_embed)
        return resample_pos_embed(self.pos_embed, grid, self.config.grid_size, self.config.num_pos_embed_prefix_tokens)

    def embed(self, images: torch.Tensor, *, keep: torch.Tensor | None = None) -> tuple[torch.Tensor, TokenPositions]:
        """``[B, C, H, W]`` images to tokens with positions added (to the patches only with
        ``no_embed_class`` or RoPE) and dropped out (``pos_drop_rate``), then, with ``keep``, only
        those patch tokens, then the pre-norm: timm's ``_pos_embed -> patch_drop -> norm_pre``.

        Args:
            images: ``[B, C, H, W]``.
            keep: ``[B, k]`` indices of the patch tokens to keep (row-major on the patch grid; MAE's
                random masking), ``None`` for all. The prefix tokens are always kept.

        Returns:
            tokens ``[B, prefix + k, D]`` (``k = gh*gw`` without ``keep``) and their positions,
            which go to every block and put patch tokens back on the grid (:meth:`token_positions`).
        """
        tokens = self.patch_embed(images)
        grid = self.patch_embed.grid_size(images.shape[2], images.shape[3])
        positions = self._position_embedding(grid)
        prefix = [
            token.expand(tokens.shape[0], -1, -1).to(tokens.dtype)
            for token in (self.cls_token, self.dist_token, self.reg_token)
            if token is not None
        ]
        if positions is None:  # positions come from RoPE alone (or not at all)
            tokens = torch.cat([*prefix, tokens], dim=1)
        elif self.config.num_pos_embed_prefix_tokens == 0:
            tokens = torch.cat([*prefix, tokens + positions], dim=1)
        else:
            tokens = torch.cat([*prefix, tokens], dim=1) + positions
        tokens, where = self.pos_drop(tokens), self.token_positions(images)
        if keep is not None:
            tokens, where = where.keep(tokens, keep)
        return self.norm_pre(tokens), where

    def token_positions(self, images: torch.Tensor) -> TokenPositions:
        """The positions of the tokens of ``images`` ``[B, C, H, W]``: every patch cell of its grid,
        row-major, after the prefix tokens. Built once per forward and carried through the blocks
        (RoPE rotates by them; read-outs put patches back on the grid by them)."""
        grid = self.patch_embed.grid_size(images.shape[2], images.shape[3])
        return TokenPositions.of_grid(grid, self.num_prefix_tokens, device=images.device)

    def _layer_head_gates(self, head_gates: HeadGates) -> list[torch.Tensor | None]:
        if head_gates is None:
            return [None] * len(self.blocks)
        if len(head_gates) != len(self.blocks):
            raise ValueError(f"head_gates needs one entry per block ({len(self.blocks)}), got {len(head_gates)}.")
        return list(head_gates)

    def _run_block(
        self,
        block: nn.Module,
        x: torch.Tensor,
        gates: torch.Tensor | None,
        need_weights: bool,
        positions: TokenPositions | None,
        attn_bias: torch.Tensor | None,
        merge: MergeStep | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One block on ``x`` (checkpointed when enabled); its weights only when asked for, so the
        fused kernel runs otherwise; ``merge`` only when given (a block may take none)."""
        kwargs = {"head_gates": gates, "positions": positions, "need_weights": need_weights, "attn_bias": attn_bias}
        if merge is not None:
            kwargs["merge"] = merge
        out = checkpoint(block, x, use_reentrant=False, **kwargs) if self._checkpointing() else block(x, **kwargs)
        return out if need_weights else (out, None)

    def _run_merging_block(
        self, index: int, x: torch.Tensor, gates: torch.Tensor | None, need_weights: bool, state: MergeState
    ) -> tuple[torch.Tensor, torch.Tensor | None, MergeState]:
        """Block ``index`` over the merged tokens of ``state``, with proportional attention unless
        ``config.merge_prop_attn`` is off, merging its ``r`` tokens (a
        :class:`~vitkit.layers.token_merging.MergeStep` as its ``merge``; none where ``r`` is 0)."""
        r = self.merge_schedule[index]
        step = MergeStep(state, r) if r > 0 else None
        bias = state.attn_bias() if self.config.merge_prop_attn else None
        x, weights = self._run_block(self.blocks[index], x, gates, need_weights, state.positions, bias, step)
        return x, weights, state if step is None else step.after

    def _merge_state(
        self, positions: TokenPositions, attn_bias: torch.Tensor | None, trace_source: bool
    ) -> MergeState | None:
        """The state merged tokens start from, or ``None`` without token merging."""
        if not self.merge_schedule:
            return None
        if attn_bias is not None:
            raise ValueError("attn_bias covers the tokens before merging: run a model without token merging "
                             "(merge_tokens(model, 0)) to pass one.")
        tracked = positions if self.config.rope != "none" else None  # only RoPE reads merged positions
        return MergeState(tracked, self.num_prefix_tokens, trace_source=trace_source)

    def _checkpointing(self) -> bool:
        return self.grad_checkpointing and torch.is_grad_enabled()

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        *,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW",
        intermediates_only: bool = False,
        return_attention: bool = False,
        head_gates: HeadGates = None,
        keep: torch.Tensor | None = None,
        attn_bias: torch.Tensor | None = None,
    ) -> Intermediates:
        """Tokens of chosen blocks and, with ``return_attention``, their attention weights.

        The arguments follow timm's ``VisionTransformer.forward_intermediates``; the result is one
        :class:`Intermediates` whatever they ask for.

        Args:
            x: images ``[B, C, H, W]``.
            indices: blocks to keep: ``None`` every block, an int ``n`` the last ``n``, a sequence
                the blocks it names (negative indices count from the end).
            return_prefix_tokens: also keep each chosen block's prefix tokens.
            norm: apply the final norm to the kept tokens.
            stop_early: stop after the last chosen block.
            output_fmt: patch tokens as ``[B, D, gh, gw]`` (``"NCHW"``) or ``[B, gh*gw, D]`` (``"NLC"``).
            intermediates_only: skip the final norm: ``features`` is ``None``.
            return_attention: keep each chosen block's post-softmax weights ``[B, H_l, N, N]``,
                part of the autograd graph (the explicit kernel runs in those blocks).
            head_gates: per block, ``None`` or gates ``[H_l]`` / ``[B, H_l]`` (a ``[depth, H]``
                tensor works when all layers have ``H`` heads).
            keep: ``[B, k]`` patch tokens to keep (:meth:`embed`); a dropped patch's cell of an
                ``"NCHW"`` grid is zero.
            attn_bias: boolean mask or additive float bias over the tokens the blocks see, for
                every block (:mod:`vitkit.layers.attention_masks`).
        """
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}.")
        take = _take_indices(len(self.blocks), indices)
        last = take[-1] if take else -1
        tokens, positions = self._embed_checked(x, keep)
        kept: list[torch.Tensor] = []
        attentions: list[torch.Tensor] = []
        sources: list[torch.Tensor] = []
        gates = self._layer_head_gates(head_gates)
        state = self._merge_state(positions, attn_bias, trace_source=True)
        for index, block in enumerate(self.blocks[: last + 1] if stop_early else self.blocks):
            wanted = index in take
            if state is None:
                tokens, weights = self._run_block(
                    block, tokens, gates[index], return_attention and wanted, positions, attn_bias
                )
            else:
                if wanted:
                    sources.append(state.current_source(tokens.shape[1], tokens))
                tokens, weights, state = self._run_merging_block(
                    index, tokens, gates[index], return_attention and wanted, state
                )
            if wanted:
                kept.append(self.norm(tokens) if norm else tokens)
                if state is not None:  # each patch takes the features of the token that holds it
                    kept[-1] = unmerge_tokens(kept[-1], state.current_source(tokens.shape[1], tokens))
                if weights is not None:
                    attentions.append(weights)
        prefix = self.num_prefix_tokens
        patches = [y[:, prefix:] for y in kept]
        if output_fmt == "NCHW":
            patches = [positions.to_grid(y) for y in patches]
        ran_every_block = not stop_early or last == len(self.blocks) - 1
        return Intermediates(
            features=self.norm(tokens) if ran_every_block and not intermediates_only else None,
            intermediates=patches,
            prefix_tokens=[y[:, :prefix] for y in kept] if return_prefix_tokens else None,
            attentions=attentions if return_attention else None,
            indices=take,
            sources=sources if state is not None else None,
        )

    def _embed_checked(
        self, images: torch.Tensor, keep: torch.Tensor | None
    ) -> tuple[torch.Tensor, TokenPositions]:
        if images.dim() != 4:
            raise ValueError(f"expected images [B, C, H, W], got shape {tuple(images.shape)}.")
        return self.embed(images, keep=keep)

    def forward_features(
        self,
        images: torch.Tensor,
        *,
        head_gates: HeadGates = None,
        keep: torch.Tensor | None = None,
        attn_bias: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Tokens after the last block and the final norm, ``[B, prefix + k, D]`` (``k = gh*gw``
        patch tokens without ``keep``).

        Args:
            images: ``[B, C, H, W]``.
            head_gates: per block, ``None`` or gates ``[H_l]`` / ``[B, H_l]`` (a ``[depth, H]``
                tensor works when all layers have ``H`` heads).
            keep: ``[B, k]`` indices of the patch tokens the blocks run on (:meth:`embed`; MAE's
                visible patches); their positions go with them (RoPE rotates by them).
            attn_bias: boolean mask (True = may attend) or additive float bias broadcastable to
                ``[B, H, N, N]`` over the tokens the blocks see, handed to every block.
        """
        x, positions = self._embed_checked(images, keep)
        state = self._merge_state(positions, attn_bias, trace_source=False)
        for index, (block, gates) in enumerate(zip(self.blocks, self._layer_head_gates(head_gates))):
            if state is None:
                x = self._run_block(block, x, gates, False, positions, attn_bias)[0]
            else:
                x, _, state = self._run_merging_block(index, x, gates, False, state)
        return self.norm(x)

    def pool(self, features: torch.Tensor) -> torch.Tensor:
        """``[B, N, D]`` tokens to ``[B, D]``: the class token (``'token'``), the mean of the patch
        tokens (``'avg'``) or the attention pool over them (``'map'``); prefix tokens (registers,
        distillation token) never enter the mean or the attention pool."""
        if self.config.global_pool == "token":
            return features[:, 0]
        patches = features[:, self.num_prefix_tokens :]
        return self.attn_pool(patches) if self.config.global_pool == "map" else patches.mean(dim=1)

    def forward_head(
        self, features: torch.Tensor, pre_logits: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Pool ``[B, N, D]`` tokens (:meth:`pool`) and classify: ``[B, num_classes]``; with
        ``head_bn``, the pooled ``[B, D]`` features are batch-normalised before the classifier
        (``pre_logits`` returns them unnormalised).

        With ``distilled``, the class and distillation tokens each go through their own head and
        the two logits are averaged (``pre_logits``: the two pooled tokens are); in training mode
        after :meth:`set_distilled_training`, the pair ``(cls_logits, dist_logits)`` is returned.
        """
        if self.config.distilled:
            return self._distilled_head(features, pre_logits)
        pooled = self.fc_norm(self.pool(features))  # the batch norm sees the features before dropout
        return self.head_drop(pooled) if pre_logits else self.head(self.head_drop(self.head_bn(pooled)))

    def _distilled_head(
        self, features: torch.Tensor, pre_logits: bool
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        cls, dist = (self.head_drop(self.fc_norm(features[:, index])) for index in (0, 1))
        if pre_logits:
            return (cls + dist) / 2
        cls, dist = self.head(cls), self.head_dist(dist)
        if self.distilled_training and self.training:
            return cls, dist
        return (cls + dist) / 2

    def forward(self, images: torch.Tensor, *, head_gates: HeadGates = None) -> torch.Tensor:
        """``[B, C, H, W]`` images to ``[B, num_classes]`` logits (see :meth:`forward_features`)."""
        return self.forward_head(self.forward_features(images, head_gates=head_gates))


def build_block(
    config: ViTConfig,
    num_heads: int,
    *,
    drop_path: float = 0.0,
    block_fn: type[nn.Module] | None = None,
    attn_impl: str | None = None,
    **factory: Any,
) -> nn.Module:
    """One block of a model of ``config`` with ``num_heads`` heads: ``config.block`` (or
    ``block_fn``) with the config's attention and MLP parts, its attention options
    (``attn_impl`` replacing the config's kernel policy) and ``factory`` (``device``, ``dtype``)."""
    options = config.attention_options()
    if attn_impl is not None:
        options = options.replace(attn_impl=attn_impl)
    block_cls = block_fn if block_fn is not None else get_part("block", config.block)
    return block_cls(
        config.embed_dim,
        num_heads,
        options,
        mlp_ratio=config.mlp_ratio,
        drop_path=drop_path,
        init_values=config.init_values,
        act_layer=config.act_layer,
        attn_layer=config.attn_layer,
        mlp_layer=config.mlp_layer,
        **factory,
    )
