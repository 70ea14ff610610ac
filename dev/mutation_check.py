"""Do the tests catch one-line bugs? Apply each mutation of a list to a copy of the repository, run
the tests that should catch it, and report which mutations survive.

    python dev/mutation_check.py                    # every mutation (~10-15 min on 2 cores)
    python dev/mutation_check.py --only layers train
    python dev/mutation_check.py --list             # the mutations, without running anything
    python dev/mutation_check.py --check            # each fragment applies once, its tests exist (.ci/run)

Each mutation replaces one exact source fragment (it must occur exactly once in its file, so the
list fails loudly when the code moves) and names the test files to run. "killed" means those
tests failed, as they should; "survived" means the bug went unnoticed. Exit code 1 if any
mutation survived or no longer applies. A developer tool: not part of the installed package, and
its fragment check runs as a CI step of its own, so refactoring a listed line does not fail the
unit tests.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    """One deliberate bug: replace ``old`` by ``new`` in ``path``; ``tests`` should catch it."""

    package: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]
    what: str


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("layers", "vitkit/layers/attention.py", "self.scale = head_dim**-0.5", "self.scale = head_dim**-1.0",
             ("tests/layers/test_attention.py",), "attention scale 1/d instead of 1/sqrt(d)"),
    Mutation("layers", "vitkit/kernels/attention.py", "weights = scores.softmax(dim=-1)",
             "weights = scores.softmax(dim=-2)", ("tests/layers/test_attention.py",), "softmax over queries"),
    Mutation("layers", "vitkit/layers/attention_masks.py", "return ~diagonal", "return diagonal",
             ("tests/layers/test_attention.py",), "locality attention keeps only the diagonal"),
    Mutation("layers", "vitkit/kernels/attention.py", "scores = scores + allowed", "scores = scores - allowed",
             ("tests/layers/test_attention.py",), "an additive bias subtracted"),
    Mutation("train", "vitkit/io.py", "[_timm_group_order(state) for state in", "[state for state in",
             ("tests/test_io_upgrade.py", "tests/train/test_resume_upgrade.py"), "old optimizer groups not reordered"),
    Mutation("train", "vitkit/train/run.py", 'pin="sdpa" if config.trainer.deterministic else None', "pin=None",
             ("tests/train/test_train_kernel_trial.py",), "a deterministic run still times its kernels"),
    Mutation("train", "vitkit/train/threads.py", "if threads > cores:", "if threads > 10 * cores:",
             ("tests/train/test_threads.py",), "oversubscribed threads not noticed"),
    Mutation("prune", "vitkit/prune/iterative.py", "for layer, head in least_scored(scorer(model, gates), gates, heads_to_prune):",
             "for layer, head in least_scored(-scorer(model, gates), gates, heads_to_prune):",
             ("tests/prune/test_prune_one_shot.py",), "one shot removes the most important heads"),
    Mutation("prune", "vitkit/cli/prune_heads.py", '        if "importance-l2" in plan:', "        if True:",
             ("tests/prune/test_prune_one_shot.py",), "an order left out of --orders is still computed"),
    Mutation("data", "vitkit/data/images.py", "upright = ImageOps.exif_transpose(image)", "upright = image",
             ("tests/data/test_bad_data.py",), "EXIF orientation ignored"),
    Mutation("cli", "vitkit/output_dirs.py", "fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n    except BlockingIOError:\n        holder",
             "pass\n    except BlockingIOError:\n        holder", ("tests/cli/test_hostile_input.py",),
             "a tool's output folder is not locked"),
    Mutation("layers", "vitkit/layers/attention_masks.py", "        return attn_bias | ~row_has_key, row_has_key",
             "        return attn_bias, None", ("tests/layers/test_attention.py",),
             "a fully masked row attends to nothing (NaN) under a boolean mask"),
    Mutation("explain", "vitkit/explain/faithfulness.py", "return torch.sort(-flat, dim=-1, stable=True).indices",
             "return torch.sort(flat, dim=-1, stable=True).indices", ("tests/explain/test_faithfulness.py",),
             "patches perturbed least relevant first"),
    Mutation("explain", "vitkit/explain/lrp.py", 'ruled.append(chunk if kind == "v" else chunk.detach())',
             "ruled.append(chunk)", ("tests/explain/test_lrp.py",), "CP-LRP lets relevance into the softmax"),
    Mutation("explain", "vitkit/explain/lrp.py",
             "w_up, w_down = weight + gamma * weight.clamp(min=0), weight + gamma * weight.clamp(max=0)",
             "w_up, w_down = weight + gamma * weight.clamp(max=0), weight + gamma * weight.clamp(min=0)",
             ("tests/explain/test_lrp.py",), "the gamma rule favours the opposing contributions"),
    Mutation("explain", "vitkit/explain/faithfulness_report.py", "        twin.reset_parameters()\n", "",
             ("tests/explain/test_faithfulness_report.py",), "the sanity check compares the model with itself"),
    Mutation("explain", "vitkit/explain/gradients.py", "torch.from_numpy(0.5 * weights).float()",
             "torch.full((steps,), 1.0 / steps)", ("tests/explain/test_gradients.py",),
             "Integrated Gradients averages the path instead of Gauss-Legendre weighting"),
    Mutation("layers", "vitkit/layers/positions.py", "picked = xy.gather(1, keep", "picked = xy.gather(1, 0 * keep",
             ("tests/layers/test_positions.py",), "dropped tokens lose their positions"),
    Mutation("layers", "vitkit/layers/block.py",
             "self.drop_path1 = DropPath(drop_path) if drop_path > 0 else nn.Identity()",
             "self.drop_path1 = nn.Identity()", ("tests/layers/test_layers.py",), "attention branch never dropped"),
    Mutation("layers", "vitkit/layers/block.py", "x = x + self.drop_path1(self.ls1(attended))",
             "x = self.drop_path1(self.ls1(attended))", ("tests/layers/test_layers.py", "tests/models/test_timm_interop.py"),
             "attention residual dropped"),
    Mutation("layers", "vitkit/layers/init_rules.py", "layer.weight.data.mul_(scale)", "layer.weight.data.mul_(1.0)",
             ("tests/layers/test_init_schemes.py", "tests/layers/test_attention.py"), "W_o init not scaled down"),
    Mutation("models", "vitkit/models/init.py", '"qkv": xavier_per_projection', '"qkv": xavier',
             ("tests/layers/test_init_schemes.py",), "qkv Xavier over the fused matrix"),
    Mutation("data", "vitkit/data/batch_transforms.py", "flip = torch.rand(batch.shape[0], device=batch.device) < self.hflip",
             "flip = torch.rand(batch.shape[0], device=batch.device) < 0.5", ("tests/data/test_data_mnist.py",), "batched flip rate ignored"),
    Mutation("data", "vitkit/data/batch_transforms.py", "top = torch.randint(0, 2 * padding + 1",
             "top = torch.randint(0, padding + 1", ("tests/data/test_data_mnist.py",), "crop offsets only one way"),
    Mutation("data", "vitkit/data/mnist.py", 'labels = read_idx(paths[(split, "labels")], LABELS_MAGIC)',
             'labels = read_idx(paths[("train", "labels")], LABELS_MAGIC)', ("tests/data/test_data_mnist.py",),
             "test split reads the training labels"),
    Mutation("train", "vitkit/train/optim.py", "1.0 + math.cos(math.pi * progress)", "2.0 - 2.0 * progress",
             ("tests/train/test_train_config.py", "tests/train/test_train_options_effect.py"), "linear decay instead of cosine"),
    Mutation("train", "vitkit/train/module.py", "self.ema.update(self.model, step=self.global_step)", "pass",
             ("tests/train/test_train_options_effect.py",), "EMA never updates"),
    Mutation("train", "vitkit/train/module.py", "            self.register_load_state_dict_pre_hook(_load_ema)",
             "            pass", ("tests/train/test_ema_copy.py",), "EMA not restored from a checkpoint"),
    Mutation("train", "vitkit/train/distributed.py", "        dist.all_reduce(summed)", "        pass",
             ("tests/train/test_sharded_training.py",), "sharded gradients clipped by a local norm"),
    Mutation("train", "vitkit/train/run.py", "precision=options.precision,", 'precision="32-true",',
             ("tests/train/test_train_options_effect.py",), "precision forced to 32-true"),
    Mutation("train", "vitkit/train/model_builder.py",
             "model.set_grad_checkpointing(config.model.grad_checkpointing)",
             "model.set_grad_checkpointing(False)", ("tests/train/test_train_options_effect.py",),
             "grad checkpointing switch ignored"),
    Mutation("train", "vitkit/pretrained.py", "        model.load_weights(state, source_grid=source.grid_size)",
             "        pass", ("tests/train/test_finetune.py", "tests/test_pretrained.py"), "pretrained weights never loaded"),
    Mutation("train", "vitkit/pretrained.py", "    reset = other_classes if reset_head is None else reset_head",
             "    reset = True", ("tests/test_pretrained.py",), "a classifier of the same classes re-initialised"),
    Mutation("train", "vitkit/pretrained.py", "    state = _adapt_channels(dict(weights.state), source, target.in_chans)",
             "    state = dict(weights.state)", ("tests/test_pretrained.py",), "channels never adapted"),
    Mutation("train", "vitkit/train/model_builder.py", "        freeze(model, config.model.freeze)",
             "        freeze(model, 'none')", ("tests/train/test_finetune.py",), "model.freeze ignored"),
    Mutation("train", "vitkit/train/model_builder.py", "        add_lora(model, config.model.lora)",
             "        pass", ("tests/train/test_finetune.py",), "model.lora ignored"),
    Mutation("train", "vitkit/train/optim.py", "no_weight_decay_list=skip, layer_decay=layer_decay)",
             "no_weight_decay_list=skip, layer_decay=1.0)", ("tests/train/test_finetune_optim.py",),
             "optim.layer_decay ignored"),
    Mutation("train", "vitkit/train/optim.py",
             "return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)",
             "return param_groups_weight_decay(model, weight_decay, no_weight_decay_list=())",
             ("tests/train/test_train_config.py",), "pos_embed / cls_token weight-decayed"),
    Mutation("data", "vitkit/data/transforms.py",
             "policy = _timm_policy(augment.rand_augment, info) if augment.rand_augment else None", "policy = None",
             ("tests/train/test_train_options_effect.py",), "RandAugment/AugMix policy dropped"),
    Mutation("data", "vitkit/data/transforms.py", "A.HorizontalFlip(p=augment.hflip)", "A.HorizontalFlip(p=0.5)",
             ("tests/train/test_train_options_effect.py",), "per-image flip rate ignored"),
    Mutation("data", "vitkit/data/images.py", "        image = to_8bit_gray(image)\n    if _has_alpha",
             "        pass\n    if _has_alpha", ("tests/data/test_bad_data.py",), "16-bit images clipped, not scaled"),
    Mutation("data", "vitkit/data/imagefolder.py", 'required=split == "train"', "required=False",
             ("tests/data/test_bad_data.py",), "empty training class folder accepted"),
    Mutation("data", "vitkit/data/cifar.py", "(labels >= num_classes)", "(labels > num_classes)",
             ("tests/data/test_bad_data.py",), "CIFAR label range off by one"),
    Mutation("data", "vitkit/data/subset.py", "if real_dst.is_relative_to(real_src):", "if real_dst == real_src:",
             ("tests/data/test_bad_data.py",), "make_subset writes inside its source"),
    Mutation("train", "vitkit/tasks/classify.py", "    if (mixup > 0 or cutmix > 0) and mixup_prob > 0:", "    if False:",
             ("tests/train/test_train_options_effect.py",), "Mixup/CutMix dropped"),
    Mutation("train", "vitkit/train/distill.py",
             "    return small_input_stem(model, config.model) if config.small_input_stem else model",
             "    return model",
             ("tests/train/test_distill.py",), "small_input_stem ignored"),
    Mutation("train", "vitkit/train/distill.py", "in_chans=info.in_chans, **config.model_kwargs",
             "in_chans=info.in_chans", ("tests/train/test_distill.py",), "teacher model_kwargs ignored"),
    Mutation("train", "vitkit/train/distill.py", "    teacher.load_state_dict(load_file(path))",
             "    pass", ("tests/train/test_distill.py",), "a timm teacher's weights file not loaded"),
    Mutation("train", "vitkit/cli/init_ablation.py", "            trainer.should_stop = True",
             "            pass", ("tests/train/test_train_reference.py",), "--stop-after-epochs ignored"),
    Mutation("train", "vitkit/cli/init_ablation.py", "        chosen = [row for row in chosen if row[0] in args.variants]",
             "        pass", ("tests/train/test_train_reference.py",), "--variants ignored"),
    Mutation("explain", "vitkit/explain/rollout.py", "mixed = (fused + eye) / 2", "mixed = fused",
             ("tests/explain/test_explain_rollout.py", "tests/explain/test_explain_readout.py"), "rollout without the residual"),
    Mutation("explain", "vitkit/explain/rollout.py",
             "    return matrix[..., num_prefix_tokens:, :].mean(dim=-2)",
             "    return matrix[..., 0, :]", ("tests/explain/test_explain_readout.py",), "read-out ignores average pooling"),
    Mutation("explain", "vitkit/explain/rollout.py", "relevance = relevance + cam @ relevance",
             "relevance = cam @ relevance", ("tests/explain/test_explain_readout.py",), "Chefer without the identity term"),
    Mutation("explain", "vitkit/cli/explain_io.py", 'names = [path.with_suffix(".png") for path in relative]',
             'names = [Path(path.stem + ".png") for path in relative]', ("tests/data/test_bad_data.py",),
             "figure names drop the image's folder"),
    Mutation("prune", "vitkit/prune/importance.py", "total += grad.abs().sum(0).cpu()",
             "total += grad.sum(0).abs().cpu()", ("tests/prune/test_prune.py", "tests/prune/test_prune_results.py"),
             "importance of batch gradients"),
    Mutation("prune", "vitkit/prune/iterative.py", "if record.accuracy < floor:", "if False:",
             ("tests/prune/test_prune.py",), "budget ignores failing steps"),
    Mutation("prune", "vitkit/prune/iterative.py", "least_scored(scorer(model, gates), gates, count)",
             "least_scored(-scorer(model, gates), gates, count)", ("tests/prune/test_prune_results.py",),
             "iterative pruning reverses its scorer"),
    Mutation("prune", "vitkit/prune/redundancy.py", "least_scored(scores, only_this_layer,",
             "least_scored(-scores, only_this_layer,", ("tests/prune/test_prune_results.py",),
             "redundancy test removes the most important heads"),
    Mutation("prune", "vitkit/evaluation.py", "predictions.append(logits.argmax(dim=-1).cpu())",
             "predictions.append(logits.argmin(dim=-1).cpu())", ("tests/test_evaluation.py",),
             "confusion matrix from the least likely class"),
    Mutation("prune", "vitkit/evaluation.py", "hits1 += round(float(acc1) * size / 100)",
             "hits1 += size - round(float(acc1) * size / 100)",
             ("tests/prune/test_prune_results.py", "tests/test_evaluation.py"), "accuracy counts the wrong predictions"),
    Mutation("train", "vitkit/evaluation.py", 'if tta == "none":\n        return views', 'if tta != "mirror":\n        return views',
             ("tests/test_evaluation.py",), "test-time mirrored views silently skipped"),
    Mutation("train", "vitkit/evaluation.py", 'if tta == "hflip_shift":\n        if fill', 'if tta == "shift":\n        if fill',
             ("tests/test_evaluation.py",), "test-time shifted views silently skipped"),
    Mutation("train", "vitkit/evaluation.py", "images[..., max(-rows, 0) : height + min(-rows, 0)",
             "images[..., max(rows, 0) : height + min(rows, 0)",
             ("tests/test_evaluation.py",), "shifted views moved the wrong way"),
    Mutation("train", "vitkit/tasks/classify.py", "self.val_tta if stage == \"val\" else self.tta, self.fill)",
             "\"none\", self.fill)", ("tests/train/test_train_options_effect.py",),
             "trainer.tta ignored by validation and test"),
    Mutation("train", "vitkit/tasks/classify.py", "self.val_tta if stage == \"val\" else self.tta, self.fill)",
             "self.tta, self.fill)", ("tests/train/test_train_options_effect.py",),
             "trainer.val_tta ignored by validation"),
    Mutation("train", "vitkit/evaluation.py", "return torch.logsumexp(log_probs, dim=0) - math.log(len(views))",
             "return log_probs.mean(dim=0)", ("tests/test_evaluation.py",),
             "views' log-probabilities averaged instead of their probabilities"),
    Mutation("train", "vitkit/evaluation.py", '    check_tta(tta, "predict_views(tta=)", "pass one of them")\n', "",
             ("tests/test_evaluation.py",), "a misspelt tta silently scored as one view"),
    Mutation("train", "vitkit/tasks/mae.py", "return (loss * mask).sum() / mask.sum()", "return loss.mean()",
             ("tests/tasks/test_mae.py",), "MAE's loss averaged over visible patches too"),
    Mutation("train", "vitkit/tasks/mae.py", "var = patches.var(dim=-1, keepdim=True)",
             "var = patches.var(dim=-1, keepdim=True, unbiased=False)", ("tests/tasks/test_mae.py",),
             "norm_pix_loss with the biased variance (MAE's is unbiased)"),
    Mutation("train", "vitkit/tasks/mae.py", "return shuffle[:, :count], torch.gather(mask, 1, restore), restore",
             "return shuffle[:, -count:], torch.gather(mask, 1, restore), restore", ("tests/tasks/test_mae.py",),
             "MAE keeps the patches of highest noise"),
    Mutation("io", "vitkit/cli/evaluate.py", 'check_output_dir(out, "evaluate")  #', 'claim_output_dir(out, "evaluate")  #',
             ("tests/cli/test_hostile_input.py",), "a refused model leaves an empty output folder"),
    Mutation("io", "vitkit/io.py", "return torch.load(path, map_location=map_location, weights_only=True)",
             "return torch.load(path, map_location=map_location, weights_only=False)",
             ("tests/train/test_train_config.py",), "checkpoints unpickled"),
    # what a new user meets first (issue 52)
    Mutation("usability", "vitkit/data/config.py", "return 1.0 if self.trains_on_whole_images() else self.defaults.crop_pct",
             "return self.defaults.crop_pct", ("tests/train/test_imagefolder_defaults.py",),
             "a folder trained on whole images evaluated on its centre crop"),
    Mutation("usability", "vitkit/data/arrays.py", "return np.asarray(order[:count], dtype=np.int64)",
             "return np.arange(min(count, len(labels)), dtype=np.int64)", ("tests/data/test_class_subsets.py",),
             "the first test images explained, not a draw across the classes"),
    Mutation("usability", "vitkit/train/datamodule.py", "if images >= self.batch_size:", "if True:",
             ("tests/data/test_class_subsets.py",), "a batch larger than the data not clamped"),
    Mutation("usability", "vitkit/cli/parsers.py", "args.checkpoint, *rest = rest", "rest = rest",
             ("tests/cli/test_cli.py",), "the positional model file ignored"),
    Mutation("usability", "vitkit/explain/faithfulness_report.py", "if on_batch is not None and on_batch(done):",
             "if on_batch is not None and on_batch(done) and False:", ("tests/explain/test_faithfulness_cli.py",),
             "a stopped faithfulness run measures every image"),
)


def _ignored(folder: str, names: list[str]) -> set[str]:
    """What the copy leaves out: caches everywhere; the venv, runs and datasets at the top."""
    top = Path(folder).resolve() == ROOT
    return {n for n in names if n == "__pycache__" or (top and n in (".git", ".venv", "runs", "data"))}


def _env(work: Path) -> dict[str, str]:
    return {"NO_ALBUMENTATIONS_UPDATE": "1", "PYTHONPATH": str(work), "PATH": "/usr/bin:/bin"}


def imports_the_copy(work: Path) -> bool:
    """Whether ``import vitkit`` inside ``work`` loads the copy (not an installed checkout)."""
    done = subprocess.run([sys.executable, "-c", "import vitkit; print(vitkit.__file__)"], cwd=work,
                          capture_output=True, text=True, env=_env(work))
    return done.returncode == 0 and Path(done.stdout.strip()).resolve().is_relative_to(work.resolve())


def run_mutation(mutation: Mutation, work: Path) -> str:
    """Apply ``mutation`` inside the copy ``work``, run its tests, restore the file: the verdict."""
    target = work / mutation.path
    source = target.read_text()
    if source.count(mutation.old) != 1:
        return "stale"  # the fragment moved or changed: the list needs updating
    target.write_text(source.replace(mutation.old, mutation.new))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *mutation.tests],
            cwd=work, capture_output=True, text=True, timeout=900, env=_env(work),
        )
    finally:
        target.write_text(source)
    return "killed" if done.returncode != 0 else "survived"


def stale(mutations: tuple[Mutation, ...]) -> list[str]:
    """Why each mutation that no longer fits the code does not (empty when all apply): its fragment
    must occur exactly once in its file, differ from its replacement, and name existing tests."""
    problems = []
    for mutation in mutations:
        path = ROOT / mutation.path
        count = path.read_text().count(mutation.old) if path.is_file() else 0
        if count != 1:
            problems.append(f"{mutation.path}: {mutation.what}: the fragment occurs {count} times, not once")
        if mutation.old == mutation.new:
            problems.append(f"{mutation.path}: {mutation.what}: the replacement equals the fragment")
        problems += [f"{mutation.path}: {mutation.what}: no test file {test}" for test in mutation.tests
                     if not (ROOT / test).is_file()]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", nargs="+", metavar="PACKAGE", help="mutations of these packages only")
    parser.add_argument("--list", action="store_true", help="print the mutations and exit")
    parser.add_argument("--check", action="store_true", help="check that every mutation still applies, run nothing")
    args = parser.parse_args(argv)
    chosen = [m for m in MUTATIONS if not args.only or m.package in args.only]
    if args.check:
        problems = stale(tuple(chosen))
        for problem in problems:
            print(f"error: stale mutation: {problem}", file=sys.stderr)
        if not problems:
            print(f"all {len(chosen)} mutations apply")
        return 1 if problems else 0
    if args.list:
        for mutation in chosen:
            print(f"{mutation.package:8} {mutation.path}: {mutation.what}")
        return 0
    results = []
    with tempfile.TemporaryDirectory(prefix="vitkit-mutants-") as tmp:
        work = Path(tmp) / "repo"
        shutil.copytree(ROOT, work, ignore=_ignored)
        if not imports_the_copy(work):
            print("error: 'import vitkit' in the copy does not load the copy; run from the repository's venv.",
                  file=sys.stderr)
            return 2
        for index, mutation in enumerate(chosen, 1):
            started = time.perf_counter()
            verdict = run_mutation(mutation, work)
            results.append((mutation, verdict))
            print(f"[{index}/{len(chosen)}] {verdict:8} {mutation.package:8} {mutation.what} "
                  f"({time.perf_counter() - started:.0f} s)", flush=True)
    survivors = [m for m, v in results if v != "killed"]
    print(f"\n{len(results) - len(survivors)} of {len(results)} mutations killed")
    for mutation, verdict in results:
        if verdict != "killed":
            print(f"{verdict}: {mutation.path}: {mutation.what}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main())
