"""Issue 39's peer table (docs/results.md, "Which map explains the prediction?"): vitkit's maps against
pytorch-grad-cam (GradCAM, GradCAM++, EigenCAM with the usual ViT reshape transform), captum
(Integrated Gradients, input x gradient) and the AttnLRP authors' lxt, on the same model, the same
test images, the same baseline and the same steps, through ``vitkit.explain.faithfulness``.

    pip install -e ".[peers]"      # lxt, zennit, captum, pytorch-grad-cam
    python dev/faithfulness_peers.py --checkpoint runs/fashion_mnist_fast/latest/model.safetensors --images 500
    python dev/faithfulness_peers.py --checkpoint MODEL --lrp-sweep --images 200   # lrp's rules, validation images
    python dev/faithfulness_peers.py --dry-run     # a random tiny model, 4 images: the script runs

Every method explains the predicted class; pixel attributions (captum, lxt) are summed per patch,
CAMs averaged per patch. lxt runs on the model's torchvision twin (the same weights; lxt's own ViT
patches and zennit's gamma rule), so only plain class-token ViTs get its row. It prints the table
(the areas of :mod:`vitkit.explain.faithfulness`, the sanity correlation and ms per image) and
writes it with the curves to --out. ``--lrp-sweep`` instead measures lrp under 24 rule settings
(both attention rules, linear gamma 0 to 1, patch gamma 0 to 1) and Integrated Gradients on the
first --images *validation* images, most faithful first (how the cp-gamma preset was chosen; the
defaults now follow dev/lrp_protocol.py's held-out models).
"""

from __future__ import annotations

import argparse
import itertools
import sys
import warnings
from pathlib import Path

import torch

import vitkit
from vitkit.explain import LRP_PRESETS, LRPRules, faithfulness
from vitkit.explain.faithfulness import pool_per_patch
from vitkit.explain.map_methods import BUILTIN_METHODS, MapMethod, map_method
from vitkit.explain.render import faithfulness_figure
from vitkit.files import markdown_table, write_csv
from vitkit.io import load_model_and_extra

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "helpers"))
from lxt_reference import lxt_relevance, torchvision_twin, twin_problem  # noqa: E402


def per_patch(pixels: torch.Tensor, model: vitkit.VisionTransformer, reduce: str) -> torch.Tensor:
    """``[B, H, W]`` pixel maps to ``[B, gh, gw]``: summed (attributions) or averaged (CAMs) per patch."""
    return pool_per_patch(pixels.float(), tuple(model.config.patch_size), reduce)


def vit_reshape(model: vitkit.VisionTransformer, grid: tuple[int, int]):
    """pytorch-grad-cam's ViT ``reshape_transform``: tokens ``[B, N, D]`` to ``[B, D, gh, gw]``."""
    def reshape(tokens: torch.Tensor) -> torch.Tensor:
        patches = tokens[:, model.num_prefix_tokens:]
        return patches.reshape(len(tokens), *grid, -1).permute(0, 3, 1, 2)
    return reshape


def grad_cam(kind: str) -> MapMethod:
    from pytorch_grad_cam import EigenCAM, GradCAM, GradCAMPlusPlus
    from pytorch_grad_cam.utils.model_targets import ClassifierOutputTarget

    cam_class = {"gradcam": GradCAM, "gradcam++": GradCAMPlusPlus, "eigencam": EigenCAM}[kind]

    def run(model: vitkit.VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        grid = model.token_positions(images).grid
        with cam_class(model=model, target_layers=[model.blocks[-1].norm1], reshape_transform=vit_reshape(model, grid)) as cam:
            maps = cam(input_tensor=images, targets=[ClassifierOutputTarget(int(t)) for t in targets])
        return per_patch(torch.from_numpy(maps), model, "mean")
    return run


def captum_method(kind: str) -> MapMethod:
    from captum.attr import InputXGradient, IntegratedGradients

    def run(model: vitkit.VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if kind == "integrated_gradients":  # captum's defaults: 50 steps, Gauss-Legendre; the mean as baseline
            # (internal_batch_size 256 as vitkit's, so memory and speed compare)
            attribution = IntegratedGradients(model).attribute(images, baselines=torch.zeros_like(images), target=targets,
                                                               internal_batch_size=256)
        else:
            attribution = InputXGradient(model).attribute(images.clone().requires_grad_(True), target=targets)
        return per_patch(attribution.detach().sum(1), model, "sum")
    return run


def lxt_method(linear_gamma: float, patch_gamma: float) -> MapMethod:
    def run(model: vitkit.VisionTransformer, images: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            relevance, _ = lxt_relevance(torchvision_twin(model), images, targets, linear_gamma, patch_gamma)
        return per_patch(relevance, model, "sum")
    return run


def peer_methods(model: vitkit.VisionTransformer) -> list[tuple[str, MapMethod]]:
    """The peers' methods this model can take (lxt only on a torchvision-expressible ViT)."""
    peers = [(f"pytorch-grad-cam {kind}", grad_cam(kind)) for kind in ("gradcam", "gradcam++", "eigencam")]
    peers += [(f"captum {kind}", captum_method(kind)) for kind in ("integrated_gradients", "input_x_gradient")]
    problem = twin_problem(model)
    if problem is None:
        rules = LRP_PRESETS["cp"]  # lxt's ViT patch holds the attention weights (CP-LRP): vitkit's "lrp cp" row
        peers.append(("lxt CP-LRP (torchvision twin)", lxt_method(rules.linear_gamma, rules.patch_gamma)))
    else:
        print(f"note: no lxt row: {problem}")
    return peers


def first_images(
    model: vitkit.VisionTransformer, extra: dict, count: int, split: str = "test"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``count`` images and labels of ``split`` (docs/results.md's tables; the datasets
    measured there store their test images in mixed class order). The lrp sweep tunes on ``val``,
    so that tuning never sees the table's test images."""
    from vitkit.data import datasets_for

    dataset = getattr(datasets_for(model, extra), split)
    pairs = [dataset[index] for index in range(min(count, len(dataset)))]
    return torch.stack([image for image, _ in pairs]), torch.tensor([label for _, label in pairs])


def sweep_lrp(model: vitkit.VisionTransformer, images: torch.Tensor, labels: torch.Tensor, batch_size: int) -> None:
    """Print deletion, insertion, positive and negative areas of each lrp setting, most faithful first."""
    methods = [("integrated_gradients", map_method("integrated_gradients"))]
    for attention, linear, patch in itertools.product(("cp", "attnlrp"), (0.0, 0.05, 0.25, 1.0), (0.0, 0.25, 1.0)):
        rules = LRPRules(attention=attention, linear_gamma=linear, patch_gamma=patch)
        methods.append((f"lrp {attention} linear {linear} patch {patch}", map_method("lrp", rules=rules)))
    report = faithfulness(model, images, labels, methods, sanity=False, batch_size=batch_size, progress=True)
    rows = [report.result(name) for name in report.ranking()]
    print(markdown_table([{"setting": r.name, **{test: round(r.mean(test), 4) for test in r.scores}} for r in rows]), end="")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="vitkit model file")
    parser.add_argument("--images", type=int, default=500, help="first N test images")
    parser.add_argument("--steps", type=int, default=None, help="perturbation steps (default one patch per step)")
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--out", default="runs/faithfulness_peers", help="folder for peers.csv, peers.md, peers.png")
    parser.add_argument("--dry-run", action="store_true", help="a random tiny model and 4 images")
    parser.add_argument("--lrp-sweep", action="store_true", help="lrp's rule settings on validation images")
    args = parser.parse_args()
    if args.dry_run:
        torch.manual_seed(0)
        model = vitkit.create_model("vit_cifar_tiny", img_size=16, patch_size=4, embed_dim=24, depth=2, num_heads=2,
                                    num_classes=3, in_chans=1).eval()
        images, labels = torch.randn(4, 1, 16, 16), torch.randint(0, 3, (4,))
    else:
        model, extra = load_model_and_extra(args.checkpoint)
        model.eval()
        if args.lrp_sweep:
            images, labels = first_images(model, extra, args.images, split="val")
        else:
            images, labels = first_images(model, extra, args.images)
    if args.lrp_sweep:
        sweep_lrp(model, images, labels, args.batch_size)
        return
    methods = [*BUILTIN_METHODS, ("lrp cp", map_method("lrp", rules=LRP_PRESETS["cp"])), *peer_methods(model)]
    report = faithfulness(model, images, labels, methods, steps=args.steps, batch_size=args.batch_size, progress=True)
    rows = report.rows()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "peers.csv", rows)
    table = markdown_table([{k: "-" if v is None else v for k, v in row.items()} for row in rows])
    (out / "peers.md").write_text(table)
    faithfulness_figure(report, out / "peers.png", f"{len(images)} test images: vitkit and its peers")
    print(table, end="")
    for test in ("deletion", "insertion", "positive", "negative"):
        print(f"best {test}: {report.best(test)}")
    print(f"most faithful (insertion minus deletion): {report.ranking()[0]}; wrote {out}/peers.csv, .md, .png")


if __name__ == "__main__":
    main()
