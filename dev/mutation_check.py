"""Do the tests catch one-line bugs? Apply each mutation of a list to a copy of the repository, run
the tests that should catch it, and report which mutations survive.

    python dev/mutation_check.py                    # every mutation (~10-15 min on 2 cores)
    python dev/mutation_check.py --only layers train
    python dev/mutation_check.py --list             # the mutations, without running anything
    python dev/mutation_check.py --check            # each fragment applies once, its tests exist (.ci/run)

Each mutation replaces one exact source fragment (it must occur exactly once in its file, so the
list fails loudly when the code moves) and names the tests to run: files, or one test of a file
(``tests/test_export.py::test_name``) where the whole file would be slow. "killed" means those
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


#: Single tests for mutations whose whole test file is slow (a training run, ONNX exports).
FINETUNE_GRAY = "tests/train/test_finetune.py::test_grayscale_data_from_rgb_weights_are_normalised_with_the_average_of_their_statistics"
RECOVER = "tests/prune/test_prune_recover.py::test_recover_steps_measures_each_steps_pruned_model_and_what_recover_returns"
RECOVER_AFTER = "tests/prune/test_prune_recover.py::test_recover_steps_measures_both_splits_after_recovery_on_the_recovered_model"
RECOVER_LR = "tests/prune/test_prune_recover.py::test_recovery_lr_is_a_tenth_of_the_recipes_and_its_min_lr_is_capped_at_the_lr"
LRP_LXT = "tests/explain/test_lrp.py::test_relevance_equals_lxt_on_the_models_torchvision_twin"
IG_FLOAT64 = "tests/explain/test_gradients.py::test_a_float64_model_equals_captum_to_1e_9_and_keeps_the_images_dtype"
EXPORT_MODE = "tests/test_export.py::test_the_model_is_left_as_it_was_in_training_mode_with_its_kernels"
EXPORT_META = "tests/test_export.py::test_the_batch_is_symbolic_only_with_dynamic_batch_and_the_preprocessing_is_in_the_metadata"
T_ATT = "tests/layers/test_attention.py"
HOSTILE = "tests/cli/test_hostile_input.py::"
PURE_BF16 = "tests/train/test_pure_bf16.py"
PREDICT_MODE = "tests/cli/test_predict.py::test_predict_uses_eval_mode_and_leaves_a_training_model_as_it_was"
DINO_OPT = "tests/train/test_dino_optimisation.py::"
DINO_SCHEDULE = "tests/tasks/test_dino.py::test_the_task_follows_dinos_temperature_schedule_and_frozen_last_layer_over_epochs"
MAE_DECODER = "tests/tasks/test_mae.py::test_the_decoder_equals_maes_forward_decoder_in_image_order"
IJEPA = "tests/tasks/test_ijepa.py"
IJEPA_RUN = "tests/train/test_ijepa_pretraining.py::test_pretraining_releases_the_target_encoder_which_fine_tunes"
MERGED_POSITIONS = "tests/models/test_token_merging.py::test_a_merged_tokens_position_is_the_size_weighted_centroid_of_its_parts"
MERGE_CONTRACT = "tests/models/test_token_merging_contract.py::"
MERGED_BIAS = "tests/models/test_token_merging.py::test_an_attention_bias_for_a_merging_model_is_refused_not_ignored"
MERGED_MAPS = ("tests/explain/test_explain_merged_tokens.py::"
               "test_gradient_maps_of_a_two_patch_merge_copy_the_gradient_and_halve_the_attention")
DEVICE_LOADER = "tests/train/test_data_on_device.py::test_the_device_loader_drops_the_last_incomplete_training_batch_only"
MULTICROP_PIXELS = "tests/tasks/test_dino.py::test_global_crops_with_the_draws_forced_are_pils_solarised_pixels_normalised"
TB = "vitkit/train/time_budget.py"
COMPAT = "vitkit/train/lightning_compat.py"
PRUNE_PLAN = "tests/prune/test_prune_one_shot.py::test_prepare_pruning_resolves_the_target_and_plans_each_order_without_any_work"
COMPAT_TESTS = "tests/train/test_lightning_compat.py"
TB_PLAN = "tests/train/test_time_budget.py::test_the_plan_is_the_most_whole_epochs_that_fit_with_the_steps_taken_counted"
TB_SHORT = "tests/train/test_time_budget.py::test_a_budget_without_room_for_one_epoch_is_refused_with_the_budget_that_fits"
TB_RESUMED = "tests/train/test_time_budget.py::test_a_run_resumed_before_its_plan_must_finish_the_epoch_under_way"
TB_WARMUP = "tests/train/test_time_budget.py::test_a_long_warmup_is_scaled_to_its_share_of_the_recipes_schedule_at_most_a_quarter"
TB_SLOWER = "tests/train/test_time_budget.py::test_a_run_that_slows_down_shortens_its_plan_to_end_within_the_budget"
TB_RUN = "tests/train/test_time_budget.py::test_the_schedule_ends_at_the_planned_step_where_lightning_stops"
TB_RESUMED_RUN = "tests/train/test_time_budget.py::test_a_resumed_run_keeps_its_plan_though_its_steps_now_take_another_time"
TB_DINO = "tests/train/test_time_budget.py::test_a_dino_budget_keeps_time_for_the_knn_pass_and_counts_the_planned_epochs"
TB_MAX_TIME = "tests/train/test_time_budget.py::test_max_time_cutting_the_schedule_short_says_where_it_was"
EVAL_FOLDER = "tests/cli/test_evaluate_folder.py::test_a_class_folder_is_scored_whole_by_the_models_classes_and_preprocessing"
EVAL_UNKNOWN = "tests/cli/test_evaluate_folder.py::test_a_folder_the_model_has_no_class_for_is_refused_in_one_line"
EVAL_TOP5 = "tests/cli/test_evaluate_folder.py::test_with_fewer_than_five_classes_there_is_no_top5"
EVAL_LOOP = "tests/test_evaluation.py"
PREDICT_FOLDER = "tests/cli/test_evaluate_folder.py::test_predict_on_a_class_folder_prints_the_accuracy_and_each_classs_counts"
BENCH_ONNX = ("tests/test_export.py::"
              "test_the_onnx_benchmark_times_the_model_file_alone_by_its_name_and_scores_it_as_evaluate_does")
EXPORT_COMMAND = "tests/test_export.py::test_the_export_command_writes_the_file_and_refuses_an_existing_one_without_force"
PREDICT_TIME = "tests/cli/test_evaluate_folder.py::test_predict_times_the_model_and_not_the_reading"
MC = "tests/data/test_multicrop.py::"
RECOVER_FAST = "tests/prune/test_prune_recover.py::"
DINO_T = "tests/tasks/test_dino.py::"
DINO_OPTIONS = "tests/tasks/test_dino_options.py::"
CLS = "tests/tasks/test_classify.py::"
MAE_REFUSE = "tests/tasks/test_mae_refusals.py::"
REGISTRY = "tests/tasks/test_registry.py::"
USER_TASK = "tests/train/test_user_task.py::test_a_task_registered_in_a_script_trains_resumes_and_exports_its_encoder"
USER_TASK_RECIPE = "tests/train/test_user_task.py"
DENSE_TASK = "tests/train/test_dense_task.py"


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("layers", "vitkit/layers/attention.py", "self.scale = head_dim**-0.5", "self.scale = head_dim**-1.0",
             ("tests/layers/test_attention.py",), "attention scale 1/d instead of 1/sqrt(d)"),
    Mutation("layers", "vitkit/kernels/attention.py", "weights = scores.softmax(dim=-1)",
             "weights = scores.softmax(dim=-2)", ("tests/layers/test_attention.py",), "softmax over queries"),
    Mutation("layers", "vitkit/kernels/linear_gelu.py", " or _hooked(fc) or _hooked(act)", " or _hooked(act)",
             ("tests/kernels/test_linear_gelu.py",), "fused MLP call skips fc1's hooks"),
    Mutation("layers", "vitkit/kernels/linear_gelu.py", "torch.compiler.is_compiling() or torch.jit.is_tracing()",
             "torch.jit.is_tracing()", ("tests/kernels/test_linear_gelu.py",), "torch.export records the oneDNN call"),
    Mutation("layers", "vitkit/kernels/linear_gelu.py", "not _enabled or torch.is_grad_enabled() or", "not _enabled or",
             ("tests/kernels/test_linear_gelu.py",), "the fused MLP call (no backward) taken in training"),
    Mutation("layers", "vitkit/kernels/linear_gelu.py", "    return 2 * rows * w_shape[1] * w_shape[0]", "    return 0",
             ("tests/kernels/test_linear_gelu.py",), "FLOP counters miss the fused MLP call"),
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
    Mutation("prune", "vitkit/prune/model_file.py", '            if "importance-l2" in plan:', "            if True:",
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
    Mutation("explain", "vitkit/explain/gradients.py", "torch.from_numpy(0.5 * weights).to(dtype)",
             "torch.full((steps,), 1.0 / steps, dtype=dtype)", ("tests/explain/test_gradients.py",),
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
    Mutation("models", "vitkit/models/init.py", '"jax": 1e-6, "mae": 0.02}', '"jax": 1e-6, "mae": 1e-6}',
             ("tests/layers/test_init_schemes.py",), "MAE's class token drawn as timm's"),
    Mutation("models", "vitkit/models/init.py", '"mlp": xavier, "head": tiny_normal}', '"mlp": xavier, "head": trunc_normal}',
             ("tests/layers/test_init_schemes.py",), "MAE's new classifier drawn at 0.02, not 2e-5"),
    Mutation("train", "vitkit/train/model_builder.py", 'WEIGHTS_DEFAULT_FIELDS = ("init", "global_pool", "fc_norm")',
             'WEIGHTS_DEFAULT_FIELDS = ("global_pool", "fc_norm")',
             ("tests/train/test_mae_pretraining.py::test_maes_own_init_and_fixed_positions_carry_into_finetuning",),
             "a variant's default init replaces the encoder's MAE init in fine-tuning"),
    Mutation("train", "vitkit/train/model_builder.py", 'WEIGHTS_DEFAULT_FIELDS = ("init", "global_pool", "fc_norm")',
             'WEIGHTS_DEFAULT_FIELDS = ("init", "fc_norm")',
             ("tests/train/test_finetune.py::test_a_variants_default_pooling_keeps_the_weights_own",),
             "a variant's default pooling replaces the weights' average pooling"),
    Mutation("train", "vitkit/pretrained.py", '        fresh += ("norm.", "fc_norm.")', '        fresh += ("fc_norm.",)',
             ("tests/train/test_finetune.py::test_maes_finetuning_pools_the_patch_tokens_under_a_new_norm",),
             "MAE's fine-tuning loads the encoder's last norm into a model without it"),
    Mutation("train", "vitkit/pretrained.py", "    reset = (other_classes or moved_norm) if reset_head is None else reset_head",
             "    reset = other_classes if reset_head is None else reset_head",
             ("tests/train/test_finetune.py::test_keeping_a_classifier_with_the_final_norm_moved_is_refused",),
             "a classifier trained on token features kept under average pooling"),
    Mutation("train", "vitkit/tasks/mae.py", "    if config.use_fc_norm:", "    if False:",
             ("tests/train/test_task_refusals.py::test_mae_refuses_an_encoder_whose_final_norm_comes_after_pooling",),
             "MAE pre-trains an encoder whose tokens reach the decoder unnormalised"),
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
    Mutation("train", "vitkit/train/module.py", "            self.register_load_state_dict_pre_hook(load_ema)",
             "            pass", ("tests/train/test_ema_copy.py",), "EMA not restored from a checkpoint"),
    Mutation("train", "vitkit/train/pure_bf16.py", "with torch.autocast(device, enabled=False):",
             "with torch.autocast(device, enabled=True):", (PURE_BF16,), "bf16-true's copy runs under autocast"),
    Mutation("train", "vitkit/train/pure_bf16.py", "            torch._foreach_copy_([copied for _, copied in pairs], [param for param, _ in pairs])",
             "            pass", (PURE_BF16,), "bf16-true's copy never takes the updated weights"),
    Mutation("train", "vitkit/train/module.py", "            self.pure_bf16.move_grads()", "            pass",
             (PURE_BF16,), "bf16-true's gradients never reach the float32 model"),
    Mutation("train", "vitkit/train/pure_bf16.py", "            copied._buffers.update(original._buffers)", "            pass",
             (PURE_BF16,), "bf16-true's copy keeps its own statistics after a device move"),
    Mutation("train", "vitkit/train/pure_bf16.py", " for param, copied in self._all_pairs if param.requires_grad]",
             " for param, copied in self._all_pairs]", (PURE_BF16,), "bf16-true copies (and moves gradients of) frozen weights"),
    Mutation("train", "vitkit/train/callbacks.py", 'os.environ[self._VARIABLE], self._changed = "0", True',
             "self._changed = True", ("tests/train/test_runtime_cuda_check.py",), "every step asks NVML whether CUDA is available"),
    Mutation("train", "vitkit/train/callbacks.py", "        self._restore()  # Lightning tears callbacks down only after a fit that ended normally",
             "        pass", ("tests/train/test_run_faults.py::test_a_run_that_fails_mid_fit_leaves_the_process_as_it_found_it",),
             "a failed fit leaves NVML's CUDA check switched off"),
    Mutation("train", "vitkit/train/callbacks.py",
             "    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:\n        if threading",
             "    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:\n        if threading",
             ("tests/train/test_run_faults.py::test_a_run_that_fails_mid_fit_leaves_the_process_as_it_found_it",),
             "Ctrl-C handler set before Lightning saves the handlers (a failed fit leaves it installed)"),
    Mutation("train", "vitkit/train/run.py", "        torch.set_num_threads(before)", "        pass",
             ("tests/train/test_threads.py",), "a run leaves the process on the recipe's thread count"),
    Mutation("train", "vitkit/train/compile_trial.py",
             "    on_validation_start = on_test_start = on_predict_start = _evaluate_eager", "",
             ("tests/train/test_compile_trial.py",), "a compiled run compiles graphs for validation and test"),
    Mutation("train", "vitkit/train/distributed.py", "    _all_reduce(summed)\n    norm = ", "    norm = ",
             ("tests/train/test_sharded_training.py",), "sharded gradients clipped by a local norm"),
    Mutation("train", "vitkit/train/run.py", "precision=options.lightning_precision,", 'precision="32-true",',
             ("tests/train/test_train_options_effect.py",), "precision forced to 32-true"),
    Mutation("train", "vitkit/train/model_builder.py",
             "model.set_grad_checkpointing(config.model.grad_checkpointing)",
             "model.set_grad_checkpointing(False)", ("tests/train/test_train_options_effect.py",),
             "grad checkpointing switch ignored"),
    Mutation("train", "vitkit/pretrained.py", "        model.load_weights(state, source_grid=source.grid_size)",
             "        pass", ("tests/train/test_finetune.py", "tests/test_pretrained.py"), "pretrained weights never loaded"),
    Mutation("train", "vitkit/pretrained.py", "    reset = (other_classes or moved_norm) if reset_head is None else reset_head",
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
    Mutation("train", "vitkit/tasks/mae.py", "            check_encoder(model, options.norm_pix_loss)\n", "            pass\n",
             ("tests/tasks/test_mae.py",), "MAE encodes through a tokenizer that sees the hidden patches"),
    Mutation("train", "vitkit/train/config.py", "        config.task.task_class.check_model(config.task.options, vit_config)\n", "        pass\n",
             ("tests/train/test_task_refusals.py",), "the task's needs of the model checked only after the data load"),
    Mutation("train", "vitkit/tasks/mae.py", "    if any(config.merge_per_block()):", "    if False:",
             ("tests/train/test_task_refusals.py::test_mae_refuses_token_merging",),
             "MAE's decoder handed merged tokens"),
    Mutation("train", "vitkit/tasks/mae.py", "    if norm_pix_loss and patch_pixels(config) < 2:", "    if False:",
             ("tests/train/test_task_refusals.py::test_mae_refuses_norm_pix_loss_over_one_pixel",),
             "norm_pix_loss over one value (a NaN at step 0)"),
    Mutation("train", "vitkit/tasks/mae.py", "        if decoder + model.num_weights() > MAX_PARAMETERS:",
             "        if False:", ("tests/train/test_task_refusals.py::test_mae_refuses_a_decoder_past_the_parameter_limit",),
             "an MAE decoder past the parameter limit allocated"),
    Mutation("train", "vitkit/tasks/dino_options.py", "            if tokens > MAX_TOKENS:", "            if False:",
             ("tests/train/test_task_refusals.py::test_dino_refuses_a_crop_past_the_token_limit",), "a DINO crop past the token limit allocated"),
    Mutation("train", "vitkit/tasks/dino_options.py", "        if 2 * (head + model.num_weights()) > MAX_PARAMETERS:",
             "        if False:", ("tests/train/test_task_refusals.py::test_dino_refuses_a_head_past_the_parameter_limit",),
             "a DINO head past the parameter limit allocated"),
    Mutation("train", "vitkit/tasks/dino.py", "        if recipe.data.augment.enabled:",
             "        if False:", ("tests/train/test_task_refusals.py::test_dino_refuses_the_data_sections_augmentation",),
             "data.augment silently unused by DINO"),
    Mutation("train", "vitkit/tasks/dino_options.py", "MIN_TEMPERATURE = 1e-3", "MIN_TEMPERATURE = 1e-300",
             ("tests/train/test_task_refusals.py::test_dino_refuses_a_temperature_below_the_floor",), "a DINO temperature that overflows (NaN at step 0)"),
    Mutation("train", "vitkit/train/model_config.py", "            if given:  # model.freeze alone",
             '            given += ["freeze"] if self.freeze != "none" else []\n            if given:  # model.freeze alone',
             ("tests/train/test_task_refusals.py::test_model_freeze_in_a_pretraining_recipe_gets_advice_that_works",),
             "a pre-training recipe's model.freeze told to set model.pretrained, refused next"),
    Mutation("train", "vitkit/train/run.py", "    for note in config.schedule_notes():\n        rank_zero_info(note)\n", "",
             ("tests/train/test_task_refusals.py::test_schedules_as_long_as_the_run_are_noted",), "a warm-up as long as the run accepted silently"),
    Mutation("train", "vitkit/tasks/dino_options.py", "self.freeze_last_layer_epochs >= epochs", "self.freeze_last_layer_epochs > epochs",
             ("tests/train/test_task_refusals.py::test_each_schedule_is_noted_when_the_run_ends_before_it",),
             "a last layer frozen for the whole run not noted"),
    # the training step vitkit takes itself (issue 50 item 5)
    Mutation("train", "vitkit/train/run.py", "[cb for cb in trainer.callbacks if not any(cb is given for given in callbacks)]",
             "trainer.callbacks", ("tests/train/test_hook_dispatch.py",), "the caller's callbacks lose their no-op hooks"),
    Mutation("train", "vitkit/train/hook_dispatch.py", "    if not lightning_skips_none_hooks():\n        return\n", "",
             ("tests/train/test_hook_dispatch.py",), "hooks set to None under a Lightning that would call them"),
    Mutation("train", "vitkit/train/checkpoint.py", "if not records or any(completed_steps(record) is None for record in records):",
             "if not records:", ("tests/train/test_run_faults.py",), "a malformed step count reaches Lightning"),
    # a user's own folders
    Mutation("usability", "vitkit/train/model_builder.py", "    if not model.pretrained_weights:\n", "    if False:\n",
             ("tests/train/test_own_images.py::test_pretrained_weights_false_builds_the_encoders_model_with_fresh_weights",),
             "model.pretrained_weights=false loads the encoder's weights all the same"),
    Mutation("usability", "vitkit/data/imagefolder.py", "if classes != [UNLABELLED] and few_labels(counts, fractions, no_split_below):",
             "if False:", ("tests/data/test_imagefolder_layouts.py::test_class_folders_too_small_to_split_train_on_every_image_with_a_note",),
             "ten labels a class split 7/1/2"),
    Mutation("usability", "vitkit/data/build.py",
             "taken = {key: value for key, value in (given or {}).items() if getattr(cfg, key) is None}", "taken = {}",
             ("tests/data/test_imagefolder_layouts.py::test_a_flat_gray_folder_settles_its_channels_and_size_from_the_images",),
             "fine-tuning ignores the encoder's image size and channels"),
    Mutation("usability", "vitkit/data/build.py", "min_classes=2 if cfg.require_classes else 1)", "min_classes=2)",
             ("tests/data/test_imagefolder_layouts.py::test_a_flat_gray_folder_settles_its_channels_and_size_from_the_images",),
             "a flat folder refused by the channel scan"),
    Mutation("usability", "vitkit/data/build.py", "check=decoder or check_images,", "check=check_images,",
             ("tests/data/test_imagefolder_layouts.py::test_a_folder_held_in_memory_decodes_each_file_once",),
             "a folder held in memory is decoded twice (a verify pass, then again)"),
    Mutation("usability", "vitkit/data/config.py", "(self.trains_on_whole_images() or not self.augment.enabled)",
             "self.trains_on_whole_images()",
             ("tests/train/test_own_images.py::test_dino_on_a_folder_decodes_each_image_and_each_knn_image_once_and_trains_from_memory",),
             "DINO on a folder reads every file every epoch"),
    Mutation("usability", "vitkit/train/datamodule.py", "        if root not in self._labelled:\n", "        if True:\n",
             ("tests/train/test_own_images.py::test_dino_on_a_folder_decodes_each_image_and_each_knn_image_once_and_trains_from_memory",),
             "task.knn_root read at the start and again at the end"),
    Mutation("usability", "vitkit/data/config.py", "return self.resolved_crop_pct() == 1.0 and (", "return (",
             ("tests/data/test_imagefolder_layouts.py::test_in_memory_needs_an_eval_crop_of_the_whole_image",),
             "a folder held in memory as centre crops, cropped again by evaluation"),
    Mutation("train", "vitkit/train/config.py", '    if "trainer.max_epochs" not in override_keys or budget is None:\n',
             "    if True:\n", ("tests/train/test_time_budget.py::test_max_epochs_on_the_command_line_switches_the_recipes_budget_off_with_a_note",),
             "the recipe's budget silently replaces the command line's max_epochs"),
    Mutation("usability", "vitkit/train/sizing.py",
             "chosen = {key: value for key, value in tier.model.items() if getattr(config.model, key) is None}",
             "chosen = dict(tier.model)",
             ("tests/train/test_own_images.py::test_pretraining_takes_a_flat_folder_sized_to_its_images_and_measures_on_the_labelled_one",),
             "the size tier overrides the recipe line's own keys"),
    # a sharded checkpoint's metadata resolves exact classes only (issue 67, S1)
    Mutation("train", "vitkit/train/checkpoint.py", "            return self._allowed[(module, name)]\n",
             "            return self._allowed.get((module, name)) or super().find_class(module, name)\n",
             ("tests/train/test_fsdp_resume.py::test_no_metadata_pickle_of_any_protocol_reaches_code",),
             "the metadata unpickler falls back to pickle's own lookup"),
    Mutation("train", "vitkit/train/checkpoint.py", "                if Path(stored.relative_path).name != stored.relative_path",
             "                if False and Path(stored.relative_path).name != stored.relative_path",
             ("tests/train/test_fsdp_resume.py::test_the_metadata_reader_reads_a_real_sharded_checkpoint_and_refuses_a_path_outside_it",),
             "a sharded entry read from outside its checkpoint"),
    Mutation("train", "vitkit/train/module.py", "        adopt_automatic_steps(checkpoint)\n", "        pass\n",
             ("tests/train/test_resume_upgrade.py",), "an automatic-loop checkpoint resumes from step 0"),
    Mutation("train", "vitkit/train/module.py", "        if not max_norm:\n            return\n", "        return\n",
             ("tests/train/test_train_options_effect.py",), "optim.clip_grad ignored"),
    Mutation("train", "vitkit/train/module.py", "with torch.autocast(self.device.type, enabled=False):",
             "with torch.autocast(self.device.type, enabled=torch.is_autocast_enabled(self.device.type)):",
             ("tests/train/test_train_options_effect.py",), "the backward and step run under the forward's autocast"),
    Mutation("train", TB, "+ self.plan.end_s <= self.budget_minutes * 60 + 1e-6", "<= self.budget_minutes * 60 + 1e-6",
             (TB_SLOWER,), "a run that slows down forgets the end of the run when it checks its plan still fits"),
    Mutation("train", TB, "if self.plan is None or not self._planned_here:", "if True:",
             (TB_SLOWER,), "a run that slows down keeps its first plan and ends past the budget"),
    Mutation("train", TB, "epoch_s = steps_per_epoch * step_s + epoch_eval_s", "epoch_s = steps_per_epoch * step_s",
             (TB_PLAN,), "a time budget's plan leaves out each epoch's validation"),
    Mutation("train", TB, "- elapsed_s - end_s +", "- elapsed_s +",
             (TB_SHORT,), "a time budget keeps no time for the test, k-NN and export"),
    Mutation("train", TB, "- end_s + steps_done * step_s", "- end_s", (TB_RESUMED,),
             "a time budget's plan counts the steps already taken twice"),
    Mutation("train", TB, "    needed = steps_done // steps_per_epoch + 1\n", "    needed = 1\n", (TB_RESUMED,),
             "a plan may end before the epoch under way"),
    Mutation("train", TB, "    if warmup_epochs <= WARMUP_SHARE * epochs:\n", "    if True:\n", (TB_WARMUP,),
             "a warm-up longer than a quarter of the plan kept"),
    Mutation("train", TB, "epochs * min(WARMUP_SHARE, warmup_epochs / recipe_epochs)", "epochs * warmup_epochs / recipe_epochs",
             (TB_WARMUP,), "a scaled warm-up not capped at a quarter of the plan"),
    Mutation("train", TB, "for a, b in zip(times[1:], times[2:])", "for a, b in zip(times, times[1:])", (TB_RUN,),
             "the first step (first-call work) timed with the others"),
    Mutation("train", TB, "step_s = statistics.median(b - a for", "step_s = statistics.mean(b - a for", (TB_RUN,),
             "a step that compiles counts in the measured step time"),
    Mutation("train", TB, "    return per_epoch, test + val + knn\n", "    return per_epoch, test + val\n", (TB_DINO,),
             "a pre-training run's time budget keeps no time for its k-NN pass"),
    Mutation("train", TB, "    set_max_epochs(trainer, plan.epochs)  #", "    set_max_epochs(trainer, plan.epochs + 1)  #",
             (TB_RUN,), "Lightning trains past the planned schedule"),
    Mutation("house", "vitkit/cli/explain_io.py", "from ..data import DataInfo, DatasetBundle,",
             "import lightning  # noqa\nfrom ..data import DataInfo, DatasetBundle,",
             ("tests/layers/test_import_layers.py::test_the_commands_that_train_nothing_load_no_lightning",),
             "vitkit maps imports Lightning again"),
    Mutation("prune", "vitkit/prune/model_file.py",
             "max_drop = DEFAULT_MAX_DROP if options.max_drop is None and target is None else options.max_drop",
             "max_drop = options.max_drop", (PRUNE_PLAN,), "an iterative run without max_drop has no budget"),
    Mutation("prune", "vitkit/prune/model_file.py", "plan[order] = steps * (options.random_seeds if order == \"random\" else 1)",
             "plan[order] = steps", (PRUNE_PLAN,), "the plan counts one random order whatever random_seeds says"),
    # Lightning's internals, all in one module, checked against the installed Lightning
    Mutation("train", COMPAT, 'CHECKED_RANGE = ("2.6", "2.7")', 'CHECKED_RANGE = ("2.5", "2.6")', (COMPAT_TESTS,),
             "a Lightning outside the checked range passes unnoticed"),
    Mutation("train", COMPAT, "    return trainer._logger_connector.should_update_logs\n", "    return True\n",
             (COMPAT_TESTS,), "every training step counted as one the loggers write"),
    Mutation("train", COMPAT, "    trainer.fit_loop.max_epochs = epochs\n", "    trainer.fit_loop.max_epochs = epochs + 1\n",
             (COMPAT_TESTS,), "a running fit's epoch limit not the one set"),
    Mutation("train", COMPAT, "    strategy._tensor_parallel_size = tensor_parallel\n", "",
             (COMPAT_TESTS,), "the FSDP mesh's tensor-parallel size left to Lightning's guess"),
    Mutation("train", "vitkit/train/module.py", "        refresh_lr(self.lr_schedulers())\n", "", (TB_RUN,),
             "the step after the plan runs at the rate of the old horizon"),
    Mutation("train", "vitkit/train/module.py", "        self.task.set_epochs(epochs)\n", "", (TB_DINO,),
             "DINO counts the recipe's epochs, not the plan's"),
    Mutation("train", TB, '        if "plan" in state_dict:\n', "        if False:\n", (TB_RESUMED_RUN,),
             "a resumed run plans again"),
    Mutation("train", "vitkit/train/run.py", "max_epochs=MAX_EPOCHS if options.time_budget_minutes else options.max_epochs",
             "max_epochs=options.max_epochs", (TB_RESUMED_RUN,), "a budget run resumed past the recipe's epochs stops"),
    Mutation("train", TB, "or timer.time_remaining() > 0 or", "or", (TB_MAX_TIME,),
             "a schedule note after a run max_time did not stop"),
    Mutation("train", TB, "{peak * horizon.factor(step):.3g} of peak", "{peak:.3g} of peak", (TB_MAX_TIME,),
             "max_time's note gives the peak as the rate it stopped at"),
    Mutation("train", "vitkit/cli/train.py", '    if "schedule_note" in summary:\n', "    if False:\n",
             ("tests/train/test_time_budget.py::test_the_closing_lines_say_where_max_time_cut_the_schedule_or_what_the_budget_planned",),
             "max_time's note missing from the closing lines"),
    Mutation("train", "vitkit/train/config.py", "if self.time_budget_minutes is not None and self.max_time_minutes is not None:",
             "if False:", ("tests/train/test_time_budget.py::test_a_budget_and_max_time_together_are_refused_at_load",),
             "a time budget accepted with max_time_minutes"),
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
    Mutation("usability", "vitkit/train/datamodule.py",
             "if images >= self.batch_size * MIN_BATCHES or (images >= self.batch_size and clamped < MIN_CLAMPED):",
             "if True:", ("tests/data/test_class_subsets.py",), "a batch larger than the data not clamped"),
    Mutation("usability", "vitkit/train/datamodule.py", "if images >= self.batch_size * MIN_BATCHES or (",
             "if images >= self.batch_size or (", ("tests/data/test_class_subsets.py",),
             "a batch that gives 3 steps an epoch of a few labels not clamped"),
    Mutation("layers", "vitkit/kernels/linear_gelu.py", "and weights_match and available(dtype)",
             "and weights_match and available()", ("tests/kernels/test_linear_gelu.py",),
             "bfloat16 fused on a CPU without a bfloat16 kernel (it raised mid-evaluation)"),
    Mutation("usability", "vitkit/cli/parsers.py", "args.checkpoint, *rest = rest", "rest = rest",
             ("tests/cli/test_cli.py",), "the positional model file ignored"),
    Mutation("usability", "vitkit/explain/faithfulness_report.py", "if on_batch is not None and on_batch(done):",
             "if on_batch is not None and on_batch(done) and False:", ("tests/explain/test_faithfulness_cli.py",),
             "a stopped faithfulness run measures every image"),

    # the fine-tuning, faithfulness, deploy and house subjects (issue 53)
    Mutation("finetune", "vitkit/train/model_builder.py", "used[key] = (sum(values) / len(values),) if channels == 1",
             "used[key] = (values[0],) if channels == 1", (FINETUNE_GRAY,),
             "1-channel data normalised with the first channel's mean and std, not their average"),
    Mutation("finetune", "vitkit/train/model_builder.py", "theirs = [sum(theirs) / len(theirs)] if channels == 1",
             "theirs = theirs[:1] if channels == 1", (FINETUNE_GRAY,),
             "the recipe's 1-channel statistics compared with the first channel's"),
    Mutation("finetune", "vitkit/train/model_builder.py", "if data.interpolation is None and interpolation is not None:",
             "if False:", ("tests/train/test_finetune.py",), "the weights' interpolation not used"),
    Mutation("finetune", "vitkit/pretrained.py", "and tuple(weights.class_names) != tuple(class_names)", "and False",
             ("tests/test_pretrained.py",), "a classifier of other classes of the same count kept"),
    Mutation("finetune", "vitkit/models/vision_transformer.py", 'blocks=[(r"^blocks\\.(\\d+)", None), (r"^norm\\.", (99999,))],',
             'blocks=[(r"^blocks\\.(\\d+)", None)],', ("tests/train/test_finetune_optim.py",),
             "the final norm learns at the head's rate, not the last block's"),
    Mutation("finetune", "vitkit/models/vision_transformer.py",
             'rope = {name for name, _ in self.named_parameters() if name.endswith(".rope.freqs")}', "rope = set()",
             ("tests/train/test_finetune_optim.py",), "mixed-RoPE frequencies weight-decayed"),
    Mutation("lora", "vitkit/layers/lora.py", "work = torch.promote_types(weight.dtype, torch.float32)",
             "work = torch.float32", ("tests/layers/test_lora.py",), "a float64 model's adapters merged in float32"),
    Mutation("lora", "vitkit/layers/lora.py", "torch.tensor(alpha / rank, **factory)", "torch.tensor(alpha, **factory)",
             ("tests/layers/test_lora.py",), "the update scaled by alpha, not alpha / rank"),
    Mutation("lora", "vitkit/layers/lora.py", "        self.train(base.training)  #", "        pass  #",
             ("tests/layers/test_lora.py",), "an adapter added to a model in eval mode drops"),
    Mutation("lora", "vitkit/layers/lora.py", "update = F.linear(F.linear(self.lora_dropout(x), self.lora_A)",
             "update = F.linear(F.linear(x, self.lora_A)", ("tests/layers/test_lora.py",), "the adapter's dropout ignored"),
    Mutation("lora", "vitkit/layers/lora.py", "        self.weight.requires_grad_(False)\n", "",
             ("tests/layers/test_lora.py",), "the base weights train under LoRA"),
    Mutation("recovery", "vitkit/prune/recovery.py", "val_after = evaluate_accuracy(recovered, val_loader",
             "val_after = evaluate_accuracy(pruned, val_loader", (RECOVER_AFTER, RECOVER),
             "the accuracy after recovery measured on the unrecovered model"),
    Mutation("recovery", "vitkit/prune/recovery.py", "min_lr=min(optim.min_lr, lr)", "min_lr=optim.min_lr",
             (RECOVER_LR,), "the recovery's min_lr not capped at its lr"),
    Mutation("recovery", "vitkit/prune/recovery.py", "lr = optim.lr * DEFAULT_LR_SHARE if lr is None else lr",
             "lr = optim.lr if lr is None else lr", (RECOVER_LR,), "recovery at the recipe's peak lr"),
    Mutation("recovery", "vitkit/prune/recovery.py", ', "optim.warmup_epochs=0",', ",",
             (RECOVER_LR,), "recovery warms up"),
    Mutation("recovery", "vitkit/prune/recovery.py", "if recovered.heads_per_layer() != step.heads_per_layer:",
             "if False:", (RECOVER,), "a recovery that changes the head counts accepted"),
    Mutation("faithful", "vitkit/explain/faithfulness.py", "insertion, _ = curve(lambda count: ranks < count, False)",
             "insertion, _ = curve(lambda count: ranks >= patches - count, False)",
             ("tests/explain/test_faithfulness.py",), "insertion reveals the least relevant patches first"),
    Mutation("faithful", "vitkit/explain/faithfulness.py", "_, negative = curve(lambda count: ranks >= patches - count, True)",
             "_, negative = curve(lambda count: ranks < count, True)", ("tests/explain/test_faithfulness.py",),
             "the negative test deletes the most relevant patches first"),
    Mutation("faithful", "vitkit/explain/faithfulness.py", "torch.trapezoid(getattr(self, name), self.fractions, dim=-1)",
             "getattr(self, name).mean(dim=-1)", ("tests/explain/test_faithfulness.py",),
             "areas as the mean of the steps, not the trapezoid"),
    Mutation("faithful", "vitkit/explain/faithfulness.py", "return F.avg_pool2d(padded, 11, stride=1)",
             "return torch.zeros_like(images)", ("tests/explain/test_faithfulness.py",), "the blur baseline is the mean"),
    Mutation("faithful", "vitkit/explain/lrp.py", "given, work = images.dtype, torch.promote_types(parameter.dtype, torch.float32)",
             "given, work = torch.float32, torch.float32", (LRP_LXT,), "a float64 model's relevance in float32"),
    Mutation("faithful", "vitkit/explain/lrp.py", "linear = (x - mean) / std.detach()", "linear = (x - mean) / std",
             ("tests/explain/test_lrp.py",), "LayerNorm's standard deviation not constant in the backward pass"),
    Mutation("faithful", "vitkit/explain/lrp.py", "_ScaleGradient.apply(chunk, 2.0 if kind == \"v\" else 4.0)",
             "_ScaleGradient.apply(chunk, 4.0 if kind == \"v\" else 2.0)", ("tests/explain/test_lrp.py",),
             "AttnLRP's query/key and value splits swapped"),
    Mutation("faithful", "vitkit/explain/gradients.py", "work = torch.promote_types(parameter.dtype, torch.float32)  #",
             "work = torch.float32  #", (IG_FLOAT64,), "a float64 model's integrated gradients summed in float32"),
    Mutation("faithful", "vitkit/explain/gradients.py", "return ((images - start).to(work) * total).to(given)",
             "return (images.to(work) * total).to(given)", ("tests/explain/test_gradients.py",),
             "integrated gradients ignore the baseline in the last product"),
    Mutation("faithful", "vitkit/explain/gradients.py", "path_targets = targets.repeat(steps)",
             "path_targets = targets.repeat_interleave(steps)", ("tests/explain/test_gradients.py",),
             "path points explain another image's target"),
    Mutation("faithful", "vitkit/explain/lrp_choice.py",
             "best = max(scores, key=lambda name: (scores[name], -list(candidates).index(name)))",
             "best = min(scores, key=lambda name: (scores[name], -list(candidates).index(name)))",
             ("tests/explain/test_lrp_choice.py",), "lrp's rules chosen by the least faithful preset"),
    Mutation("faithful", "vitkit/explain/lrp_choice.py", 'report.result(name).mean("insertion") - report.result(name).mean("deletion")',
             'report.result(name).mean("deletion") - report.result(name).mean("insertion")',
             ("tests/explain/test_lrp_choice.py",), "the choice's score has its sign turned"),
    Mutation("faithful", "vitkit/cli/faithfulness.py", "        rules = choice.rules\n", "        rules = None\n",
             ("tests/explain/test_faithfulness_cli.py::test_lrp_rules_auto_measures_the_rules_it_names",),
             "--lrp-rules auto names a choice and measures the default rules"),
    Mutation("faithful", "vitkit/cli/faithfulness.py", 'draw_images(bundle, "val", args.lrp_choice_images',
             'draw_images(bundle, "test", args.lrp_choice_images',
             ("tests/explain/test_faithfulness_cli.py::test_the_table_figure_and_next_step",),
             "--lrp-rules auto chooses on the test images it reports"),
    Mutation("deploy", "vitkit/export.py", "        model.train(was_training)", "        pass",
             (EXPORT_MODE,), "export_onnx leaves a model in training mode in eval mode"),
    Mutation("deploy", "vitkit/export.py", "            module.attn_impl = kernel", "            pass",
             (EXPORT_MODE,), "export_onnx leaves every attention layer pinned to SDPA"),
    Mutation("deploy", "vitkit/export.py", "PREPROCESSING_KEY, json.dumps(extra or {})", "PREPROCESSING_KEY, json.dumps({})",
             (EXPORT_META,), "the preprocessing left out of the ONNX file"),
    Mutation("deploy", "vitkit/export.py", 'dynamic_shapes={"images": {0: "batch"}} if dynamic_batch else None',
             "dynamic_shapes=None", (EXPORT_META,), "--dynamic-batch ignored"),
    Mutation("deploy", "vitkit/export.py", "batches = images.split(1) if self.fixed_batch else (images,)",
             "batches = (images,)", ("tests/test_export.py::test_predict_on_the_onnx_file_gives_the_model_file_s_output",),
             "a graph of batch 1 given every image at once"),
    Mutation("deploy", "vitkit/evaluation.py", "        model.train(was_training)", "        pass", (PREDICT_MODE,),
             "predict leaves a model in training mode in eval mode"),
    Mutation("deploy", "vitkit/evaluation.py", "    model.eval()\n    if frozen:", "    if frozen:", (PREDICT_MODE,),
             "predict runs a model in training mode with its dropout"),
    Mutation("house", "vitkit/layers/decoding.py", 'bias = attn_bias.to(x.device).masked_fill(~causal, float("-inf"))',
             "bias = attn_bias.to(x.device)", (T_ATT,), "causal attention with a float bias loses its causal mask"),
    Mutation("house", "vitkit/layers/attention_masks.py", "    attn_bias = attn_bias.to(like.dtype)\n", "",
             (T_ATT,), "a float bias not cast to the queries' dtype"),
    Mutation("house", "vitkit/layers/attention_masks.py", "return attn_bias.masked_fill(~row_has_key, 0.0), row_has_key",
             "return attn_bias, row_has_key", (T_ATT,), "a row whose bias is all -inf gives NaN"),
    Mutation("house", "vitkit/layers/attention_masks.py", "return cols <= rows + offset", "return cols <= rows",
             (T_ATT,), "the causal mask aligned top-left with a KV cache"),
    Mutation("house", "vitkit/layers/decoding.py", "if self.locality:  # LSA", "if self.locality and kv_cache is None:  # LSA",
             (T_ATT,), "LSA decoding with a KV cache lets each token see itself"),
    Mutation("house", "vitkit/layers/attention_masks.py", "== rows + (keys - num_tokens)", "== rows",
             (T_ATT,), "LSA's diagonal aligned top-left against a KV cache"),
    Mutation("house", "vitkit/output_dirs.py",
             "            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\n        except BlockingIOError:\n            holder",
             "            pass\n        except BlockingIOError:\n            holder",
             (HOSTILE + "test_the_lock_of_a_killed_run_is_not_stale",), "a run directory resumed by two processes at once"),
    Mutation("house", "vitkit/output_dirs.py", "        if complete:\n            _write_marker", "        if True:\n            _write_marker",
             (HOSTILE + "test_a_folder_a_stopped_command_left_is_named_by_the_next_run",),
             "a stopped command's folder marked complete"),
    Mutation("house", "vitkit/output_dirs.py", 'if previous.get("state") == "running":', "if False:",
             (HOSTILE + "test_a_folder_a_stopped_command_left_is_named_by_the_next_run",),
             "a folder a stopped command left half-written not named"),
    Mutation("house", "vitkit/output_dirs.py", "os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK",
             "os.O_RDWR | os.O_CREAT | os.O_NONBLOCK",
             (HOSTILE + "test_a_marker_that_is_a_symlink_is_refused_and_its_target_never_written",),
             "a marker that is a symlink followed"),
    Mutation("house", "vitkit/layers/decoding.py", "causal = causal_mask(x.shape[1], k.shape[-2], x.device)",
             "causal = causal_mask(x.shape[1], x.shape[1], x.device)", (T_ATT,),
             "the queries attend to their own chunk only, not to the cached keys"),
    Mutation("house", "vitkit/io.py", 'values.setdefault("pos_drop_rate", values.get("drop_rate", 0.0))',
             'values.setdefault("pos_drop_rate", 0.0)', ("tests/test_io_upgrade.py", "tests/train/test_resume_upgrade.py"),
             "a format-1 model's position dropout lost (it followed drop_rate)"),
    Mutation("house", "vitkit/io.py", "    if not isinstance(values, dict) or version == FORMAT_VERSION:\n        return values",
             "    if True:\n        return values", ("tests/test_io_upgrade.py",), "format-1 model configs not upgraded"),
    Mutation("house", "vitkit/io.py", 'values["locality"] = values.pop("locality_attention")', 'values.pop("locality_attention")',
             ("tests/test_io_upgrade.py",), "an old file's locality_attention dropped, not renamed"),
    Mutation("train", "vitkit/tasks/dino.py",
             "teacher_temperature(self.epoch, self.warmup_teacher_temp, self.teacher_temp,",
             "teacher_temperature(self.epoch, self.teacher_temp, self.warmup_teacher_temp,", (DINO_SCHEDULE,),
             "DINO's teacher temperature warms up from the final one to the warm-up one"),
    Mutation("train", "vitkit/tasks/dino.py", "freeze_last_layer=self.epoch < self.freeze_last_layer_epochs",
             "freeze_last_layer=self.epoch <= self.freeze_last_layer_epochs", (DINO_SCHEDULE,),
             "DINO's last layer frozen one epoch too long"),
    Mutation("data", "vitkit/data/multicrop.py", "solarized & (crops >= 0.5)", "solarized & (crops < 0.5)",
             (MULTICROP_PIXELS,), "multi-crop solarisation inverts the dark pixels"),
    Mutation("data", "vitkit/data/multicrop.py", "return crops.sub_(self.mean).div_(self.std).contiguous()",
             "return crops.sub_(self.mean).contiguous()", (MULTICROP_PIXELS,), "multi-crop views not divided by the std"),
    Mutation("train", "vitkit/tasks/mae.py", "filled = filled.gather(1, restore.unsqueeze(-1).expand(-1, -1, x.shape[-1]))",
             "filled = filled", (MAE_DECODER,), "MAE's decoder never puts the tokens back in image order"),
    Mutation("train", "vitkit/tasks/ijepa_masks.py", "top = int(torch.randint(0, height - h + 1, (1,), generator=generator))",
             "top = int(torch.randint(0, height - h, (1,), generator=generator))", (IJEPA,),
             "I-JEPA's blocks never reach the grid's last row (the reference's exclusive upper end)"),
    Mutation("train", "vitkit/tasks/ijepa_masks.py", "for region in allowed[: max(len(allowed) - tries, 0)]:",
             "for region in allowed[:0]:", (IJEPA,), "I-JEPA's context not kept off the targets"),
    Mutation("train", "vitkit/tasks/ijepa_masks.py", "            if len(indices) > self.min_keep:",
             "            if len(indices) >= self.min_keep:", (IJEPA,), "an I-JEPA block of min_keep patches accepted"),
    Mutation("train", "vitkit/tasks/ijepa_masks.py", "            if patches <= self.min_keep:", "            if False:",
             (IJEPA,), "I-JEPA blocks that can never keep min_keep patches sampled forever"),
    Mutation("train", "vitkit/tasks/ijepa.py", "return gather_tokens(F.layer_norm(features, features.shape[-1:]), targets)",
             "return gather_tokens(features, targets)", (IJEPA,), "I-JEPA's targets not layer-normalised"),
    Mutation("train", "vitkit/tasks/ijepa.py", 'table = rearrange(sincos_2d_pos_embed(dim, grid[::-1]), "(w h) d -> (h w) d", w=grid[1])',
             'table = sincos_2d_pos_embed(dim, grid)', (IJEPA,), "I-JEPA's predictor positions with row and column swapped"),
    Mutation("train", "vitkit/tasks/ijepa.py", "target_momentum(step - 1, total_steps, *self.momentum)",
             "target_momentum(step, total_steps, *self.momentum)", (IJEPA,), "I-JEPA's momentum a step ahead"),
    Mutation("train", "vitkit/tasks/ijepa.py", "        self.steps.fill_(step)", "        self.steps.fill_(0)",
             (IJEPA,), "I-JEPA's block sizes seeded alike every step"),
    Mutation("train", "vitkit/tasks/ijepa.py", "            self.target_encoder.eval()\n",
             "            self.target_encoder.train(mode)\n", (IJEPA,), "I-JEPA's targets computed with dropout"),
    Mutation("train", "vitkit/tasks/ijepa.py", "        return self.target_encoder\n", "        return model\n",
             (IJEPA, IJEPA_RUN), "I-JEPA releases the context encoder, not the target encoder the paper evaluates"),
    Mutation("layers", "vitkit/layers/token_merging.py",
             "parts.append(self._padded_xy(size) * size)",
             "parts.append(self._padded_xy(size))", (MERGED_POSITIONS,),
             "merged tokens' RoPE positions not size-weighted"),
    Mutation("layers", "vitkit/layers/token_merging.py", "        if batch > 1:  # rows of the flattened batch",
             "        if batch > 3:  # rows of the flattened batch",
             ("tests/models/test_token_merging.py::test_matching_merges_sizes_and_sources_equal_tomes",
              MERGE_CONTRACT + "test_a_single_image_merges_as_tome_merges_it_and_as_it_does_in_a_batch"),
             "the batch-1 shortcut (no per-image row offsets) taken for a batch of several images"),
    Mutation("models", "vitkit/models/vision_transformer.py", "        if not self.merge_schedule:\n            return None",
             "        if not self.merge_schedule or self.training:\n            return None",
             ("tests/train/test_train_with_merging.py::test_a_recipes_merge_tokens_merges_in_every_training_step_and_every_weight_learns",),
             "token merging only at inference: a recipe's model.merge_tokens trains the plain model"),
    Mutation("layers", "vitkit/layers/token_merging.py", "x, self.after = self.before.merged(x, metric, self.r)",
             "x, self.after = self.after.merged(x, metric, self.r)", (MERGE_CONTRACT + "test_checkpointed_blocks_recompute_the_same_merges_and_gradients",),
             "a checkpointed block's recomputation merges the already merged tokens again"),
    Mutation("layers", "vitkit/layers/token_merging.py", '    if "merge" not in inspect.signature(block.forward).parameters:',
             "    if False:", (MERGE_CONTRACT + "test_a_block_or_an_attention_that_cannot_merge_is_refused_in_one_line",),
             "a block that cannot merge is accepted, and merging silently does nothing"),
    Mutation("layers", "vitkit/layers/attention.py", "                keys = k.mean(dim=1)", "                keys = v.mean(dim=1)",
             (MERGE_CONTRACT + "test_the_attention_returns_its_normed_keys_averaged_over_the_heads_before_rope",),
             "token merging matches tokens on the values instead of the keys"),
    Mutation("layers", "vitkit/layers/block.py", "            x = merge(x + self.drop_path1(self.ls1(attended)), keys)",
             "            x = x + self.drop_path1(self.ls1(attended))",
             ("tests/models/test_token_merging.py::test_decreasing_schedule_matches_tome",),
             "the encoder block ignores the merge it is handed"),
    Mutation("layers", "vitkit/layers/attention_masks.py", "    torch._assert_async(finite_or_forbidden, ",
             "    assert bool(finite_or_forbidden), (", ("tests/train/test_no_host_sync.py::test_a_merged_models_forward_and_backward_make_no_host_sync",),
             "a float bias checked by a host read: a sync per block of a merged model"),
    Mutation("models", "vitkit/models/vision_transformer.py",
             '        if attn_bias is not None:\n            raise ValueError("attn_bias covers',
             '        if False:\n            raise ValueError("attn_bias covers', (MERGED_BIAS,),
             "a merging model ignores an attn_bias instead of refusing it"),
    Mutation("explain", "vitkit/explain/maps.py", "gradients = [unmerge_gradient(g, source) for g",
             "gradients = [unmerge_attention(g, source) for g", (MERGED_MAPS,),
             "a merged model's gradients spread over merged patches like attention"),
    Mutation("train", "vitkit/train/datamodule.py", "shuffle=train, drop_last=train,\n            collate_fn",
             "shuffle=train, drop_last=False,\n            collate_fn", (DEVICE_LOADER,),
             "the on-device training loader keeps the last incomplete batch"),
    Mutation("recovery", "vitkit/prune/recovery.py", "test_acc = (test_before, evaluate_accuracy(recovered, test_loader",
             "test_acc = (test_before, evaluate_accuracy(pruned, test_loader", (RECOVER_AFTER,),
             "the test accuracy after recovery measured on the unrecovered model"),
    Mutation("house", "vitkit/io.py", "return recorded if held(recorded) else ", "return ",
             ("tests/train/test_dino_pretraining.py::test_dino_checkpoint_reads_as_the_teacher_its_run_releases",),
             "a DINO checkpoint read as the student, not the teacher its run releases"),
    Mutation("house", "vitkit/io.py", "expected[name].is_floating_point() and not tensor.is_floating_point()",
             "expected[name].is_floating_point() and False",
             (HOSTILE + "test_a_header_relabelling_float_weights_as_integers_is_one_error_naming_the_tensor",),
             "float weights relabelled as integers loaded as values near 1e9"),
    Mutation("house", "vitkit/cli/predict.py", "        refuse_onnx_options(args)\n", "",
             ("tests/cli/test_hostile_onnx.py::test_an_option_an_onnx_model_cannot_take_is_refused_not_ignored",),
             "--merge-tokens, --mean, --std, --precision ignored on an .onnx model"),
    Mutation("house", "vitkit/train/callbacks.py", "frame: FrameType | None) -> None:\n        raise SIGTERMException",
             "frame: FrameType | None) -> None:\n        pass",
             ("tests/train/test_run_faults.py::"
              "test_sigterm_during_the_end_of_run_work_stops_it_at_once_with_143_keeping_the_checkpoints",),
             "SIGTERM during the end-of-run test and k-NN ignored (exit 0 after the work)"),
    Mutation("house", "vitkit/files.py", 'return next((what for test, what in kinds if test(mode)), "is a file")',
             'return "does not exist"', (HOSTILE + "test_a_model_path_that_is_no_file_is_named_for_what_it_is",
                                         HOSTILE + "test_a_file_as_an_image_folder_root_is_named_a_file"),
             "a folder, FIFO, device or file said not to exist"),
    Mutation("house", "vitkit/train/model_builder.py", '    "merge_tokens",  # an inference option', '    # "merge_tokens",',
             ("tests/train/test_finetune.py::test_a_model_saved_with_token_merging_fine_tunes_without_it",),
             "a model saved with token merging refused fine-tuning without it, as if merging were architecture"),
    Mutation("house", "vitkit/train/run.py", "kept = Path(last.path).is_file() or is_sharded_checkpoint(last.path)",
             "kept = Path(last.path).is_file()",
             ("tests/train/test_run_faults.py::test_sigterm_of_an_fsdp_run_names_its_sharded_last_checkpoint",),
             "an FSDP run stopped by SIGTERM says 'no checkpoint' beside its sharded last.ckpt"),
    Mutation("house", "vitkit/__main__.py", "    sys.exit(main())", "    pass",
             ("tests/cli/test_cli.py::test_python_dash_m_vitkit_runs_the_vitkit_command",), "python -m vitkit does nothing"),
    Mutation("house", "vitkit/train/callbacks.py", "            signal.signal(signal.SIGTERM, self._request)",
             "            pass", ("tests/train/test_run_faults.py::"
                                 "test_sigterm_stops_both_processes_of_a_two_process_run_at_one_step_with_143",),
             "SIGTERM to a 2-process run left to Lightning's handler, which hangs both ranks in a collective"),
    Mutation("evaluate", "vitkit/class_folders.py", "scan_split(root, list(class_names))", "scan_split(root, folders)",
             (EVAL_FOLDER,), "a test folder labelled in its folders' sorted order, not the model's class order"),
    Mutation("evaluate", "vitkit/class_folders.py", "unknown = sorted(set(folders) - set(class_names))", "unknown = []",
             (EVAL_UNKNOWN,), "a test folder the model has no class for not refused in one line"),
    Mutation("evaluate", "vitkit/class_folders.py", "present = set(self.labels)",
             "present = set(range(len(self.class_names)))", (EVAL_FOLDER,),
             "a test folder with a subset of the model's classes not said so"),
    Mutation("evaluate", "vitkit/train/eval_report.py", "round(scores.top5, 3) if info.num_classes >= 5 else None",
             "round(scores.top5, 3)", (EVAL_TOP5,), "top-5 reported (always 100%) with fewer than 5 classes"),
    Mutation("evaluate", "vitkit/train/eval_report.py", 'atomic_write(out_dir / "confusion_matrix.csv", write_csv)',
             "None", (EVAL_FOLDER,), "the confusion matrix's CSV not written"),
    Mutation("evaluate", "vitkit/evaluation.py", "seconds += time.perf_counter() - start", "seconds += 0.0",
             (EVAL_LOOP,), "the evaluation's images/s not timed"),
    Mutation("evaluate", "vitkit/evaluation.py", 'device = model_device(model) if is_module else torch.device("cpu")',
             "device = model_device(model)", (EVAL_LOOP,), "an exported graph (a callable) cannot be evaluated"),
    Mutation("evaluate", "vitkit/cli/predict.py", "print_scores(scored, top1, folders, info.class_names)", "None",
             (PREDICT_FOLDER,), "predict on a class-folder tree prints no accuracy"),
    Mutation("evaluate", "vitkit/class_folders.py", "            return None\n        labels.append",
             "            continue\n        labels.append", (PREDICT_FOLDER,),
             "images outside class folders scored as if labelled"),
    Mutation("evaluate", "vitkit/cli/predict.py", "seconds += time.perf_counter() - start", "seconds += 0.0",
             (PREDICT_TIME,), "predict's images/s not timed"),
    Mutation("evaluate", "vitkit/bench/onnx_runtime.py", "evaluate_model(run, loader, tta=tta, fill",
             'evaluate_model(run, loader, tta="none", fill', (BENCH_ONNX,),
             "the onnx benchmark's top-1 scores one view where vitkit evaluate averages the recorded views"),
    Mutation("evaluate", "vitkit/bench/onnx_runtime.py", 'models_built = [(f"{Path(model_file).name} ({shape})", (model, extra))]',
             'models_built = [("Fashion-MNIST fast", (model, extra))]', (BENCH_ONNX,),
             "the onnx benchmark labels a model file as the Fashion-MNIST fast model"),
    Mutation("evaluate", "vitkit/cli/benchmark.py", 'if args.onnx_model and "onnx" not in args.sections:', "if False:",
             ("tests/cli/test_benchmark_data.py",), "--onnx-model without the onnx section silently ignored"),
    Mutation("evaluate", "vitkit/cli/export.py", 'print(f"next: vitkit predict {path} IMAGE_OR_FOLDER',
             'print(f"next: python -c {path} IMAGE_OR_FOLDER', (EXPORT_COMMAND,),
             "export's closing line does not suggest vitkit predict on the .onnx file"),
    # Survivors of the generated mutants (dev/mutmut_run.py) that a new test kills: kept as regressions.
    Mutation("data", "vitkit/data/multicrop.py", "crops = ((crops - gray) * factor(SATURATION) + gray)",
             "crops = ((crops - gray) * factor(CONTRAST) + gray)",
             (MC + "test_color_jitter_is_torchvisions_brightness_contrast_saturation_and_grayscale",),
             "DINO's saturation jitter drawn with the contrast's strength"),
    Mutation("data", "vitkit/data/multicrop.py", "* factor(CONTRAST) + mean).clamp_(0, 1)",
             "* factor(CONTRAST) + mean).clamp_(0, None)",
             (MC + "test_color_jitter_is_torchvisions_brightness_contrast_saturation_and_grayscale",),
             "a strong contrast jitter leaves pixels above 1"),
    Mutation("data", "vitkit/data/multicrop.py", "weights = torch.tensor(LUMA, dtype=crops.dtype)",
             "weights = torch.tensor(LUMA[::-1], dtype=crops.dtype)",
             (MC + "test_color_jitter_is_torchvisions_brightness_contrast_saturation_and_grayscale",),
             "grayscale weighs the channels as BGR"),
    Mutation("data", "vitkit/data/multicrop.py", "sigma = torch.empty(batch, 1).uniform_(*BLUR_SIGMA)",
             "sigma = torch.empty(1, 1).uniform_(*BLUR_SIGMA)",
             (MC + "test_gaussian_blur_is_torchvisions_at_each_images_sigma_and_leaves_the_others",),
             "one blur sigma for the whole batch"),
    Mutation("data", "vitkit/data/multicrop.py", "radius = min(math.ceil(3 * BLUR_SIGMA[1])",
             "radius = min(math.ceil(2 * BLUR_SIGMA[1])", (MC + "test_the_blur_reaches_three_sigmas_of_the_largest_sigma",),
             "the blur's kernel cut at two sigmas"),
    Mutation("data", "vitkit/data/multicrop.py", "first = fits.int().argmax(dim=1, keepdim=True)",
             "first = fits.int().argmax(dim=1, keepdim=True)[:1]",
             (MC + "test_crop_boxes_follow_torchvisions_random_resized_crop_distribution",),
             "one crop box for the whole batch"),
    Mutation("data", "vitkit/data/multicrop.py", "(widths <= width) & (heights <= height)",
             "(widths < width) & (heights < height)",
             (MC + "test_crop_boxes_follow_torchvisions_random_resized_crop_distribution",),
             "full-width and full-height crops refused"),
    Mutation("data", "vitkit/data/multicrop.py", "theta[:, 0, 0], theta[:, 0, 2] = mirror * w / width, (2 * left + w)",
             "theta[:, 0, 0], theta[:, 0, 2] = mirror * w / width, (2 * left + 0 * w)",
             (MC + "test_each_crop_is_its_box_read_bilinearly_at_the_output_pixel_centres",),
             "crops shifted half a box left of their boxes"),
    Mutation("data", "vitkit/data/multicrop.py", 'mode="bilinear", padding_mode="border"',
             'mode="bilinear", padding_mode="zeros"',
             (MC + "test_a_whole_image_crop_is_the_image_mirrored_at_the_rate_asked_and_resized_as_torchvision",),
             "crops darkened at the image's edge (zeros read past it)"),
    Mutation("data", "vitkit/data/multicrop.py", "BLUR_PROBABILITY[0], 0.0),", "BLUR_PROBABILITY[1], 0.0),",
             (MC + "test_each_crop_is_blurred_with_dinos_probability_for_it",), "the first global crop blurred rarely"),
    Mutation("data", "vitkit/data/multicrop.py", "BLUR_PROBABILITY[2], 0.0)]", "BLUR_PROBABILITY[2], SOLARIZE_PROBABILITY)]",
             (MC + "test_only_the_second_global_crop_is_solarised_and_mirroring_defaults_to_half",),
             "local crops solarised"),
    Mutation("data", "vitkit/data/multicrop.py", "dataset.labels, crops.one, crops)", "dataset.labels, crops.one)",
             (MC + "test_an_in_memory_dataset_crops_each_loader_batch_in_one_call",),
             "an in-memory dataset multi-cropped image by image, not a batch at once"),
    Mutation("data", "vitkit/data/multicrop.py", "crops.one, dataset.in_chans)", "crops.one)",
             (MC + "test_an_image_folder_gives_each_file_its_crops_and_other_datasets_are_refused",),
             "a grayscale image folder multi-cropped in colour"),
    Mutation("recovery", "vitkit/prune/recovery.py",
             "val_after = evaluate_accuracy(recovered, val_loader, max_batches=max_batches)",
             "val_after = evaluate_accuracy(recovered, val_loader)",
             (RECOVER_FAST + "test_each_evaluation_stops_after_max_batches",), "recovery's evaluation ignores max_batches"),
    Mutation("recovery", "vitkit/prune/recovery.py", '"model.reset_head=false"', '"model.reset_head=true"',
             (RECOVER_FAST + "test_the_recovery_run_trains_the_pruned_weights_as_they_are_with_the_recipes_data_changes",),
             "recovery replaces the pruned model's classifier"),
    Mutation("recovery", "vitkit/prune/recovery.py", "        self.runs[step.step] = result.run_dir\n", "",
             (RECOVER_FAST + "test_a_recipe_recovery_saves_each_steps_model_with_its_record_and_keeps_each_runs_folder",),
             "recovery forgets each step's run folder"),
    Mutation("recovery", "vitkit/prune/recovery.py", '"heads_pruned": {str(layer): indices', '"heads_pruned": {str(layer): []',
             (RECOVER_FAST + "test_a_pruning_record_names_the_source_the_heads_pruned_and_the_heads_left",),
             "a pruned file's record lists no pruned heads"),
    Mutation("dino", "vitkit/tasks/dino.py", "hidden_dim: int = 2048, bottleneck_dim: int = 256, layers: int = 3,",
             "hidden_dim: int = 2048, bottleneck_dim: int = 256, layers: int = 4,",
             (DINO_T + "test_the_heads_defaults_are_dinos_and_its_last_layer_learns_unless_frozen",), "DINO's head one layer deeper by default"),
    Mutation("dino", "vitkit/tasks/dino.py", "trunc_normal_(layer.weight, std=0.02)", "trunc_normal_(layer.weight)",
             (DINO_T + "test_the_heads_defaults_are_dinos_and_its_last_layer_learns_unless_frozen",), "the head's MLP drawn with std 1"),
    Mutation("dino", "vitkit/tasks/dino.py", "    if warmup_epochs == 1:", "    if warmup_epochs == 2:",
             (DINO_T + "test_teacher_temperature_and_momentum_at_the_edges_are_dinos_schedules",), "a two-epoch warm-up never reaches the temperature"),
    Mutation("dino", "vitkit/tasks/dino.py", "math.pi * step / max(1, total_steps)", "math.pi * step / max(2, total_steps)",
             (DINO_T + "test_teacher_temperature_and_momentum_at_the_edges_are_dinos_schedules",), "a one-step run's momentum stops short of 1"),
    Mutation("dino", "vitkit/tasks/dino.py", "                                 norm_last_layer=options.norm_last_layer)",
             "                                 )", (DINO_T + "test_the_tasks_head_follows_its_options_and_defaults_to_dinos",),
             "task.dino.norm_last_layer ignored"),
    Mutation("dino", "vitkit/tasks/dino.py", "probs = F.softmax((teacher.float() - center) / temp, dim=-1)",
             "probs = F.softmax(teacher.float() / temp, dim=-1)",
             (DINO_T + "test_a_training_step_logs_the_teachers_entropy_and_weighs_by_its_images",), "the logged entropy of the uncentred teacher"),
    Mutation("dino", "vitkit/tasks/dino.py", "model.forward_features(images), pre_logits=True)", "model.forward_features(images))",
             (DINO_T + "test_the_student_reads_the_pooled_feature_and_its_last_layer_learns_by_default",), "DINO's head reads a classifier's logits"),
    Mutation("dino", "vitkit/tasks/dino.py", "local_size=options.local_size, local_crops=options.local_crops,",
             "local_size=options.local_size, local_crops=2,",
             (DINO_T + "test_from_recipe_builds_the_crops_and_head_from_the_options_and_the_data",), "task.dino.local_crops ignored"),
    Mutation("dino", "vitkit/tasks/dino.py", 'if recipe.trainer.strategy.startswith("fsdp")', 'if recipe.trainer.strategy == "fsdp"',
             (DINO_T + "test_conflicts_and_the_augment_refusal_name_what_to_change",), "DINO under fsdp_full not refused"),
    Mutation("dino", "vitkit/tasks/dino_options.py", "            if low > high:", "            if low >= high:",
             (DINO_OPTIONS + "test_a_scale_range_may_be_one_value_but_not_reversed",), "a one-value scale range refused"),
    Mutation("dino", "vitkit/tasks/dino_options.py", '{"local_size": self.local_size} if self.local_crops else {}',
             '{"local_size": self.local_size}',
             (DINO_OPTIONS + "test_the_global_crop_defaults_to_the_images_height_and_local_crops_count_only_when_asked",),
             "an unused local_size refused"),
    Mutation("dino", "vitkit/tasks/dino_options.py", "tokens = (size // model.patch_size[0]) * (size // model.patch_size[1])",
             "tokens = (size // model.patch_size[1]) * (size // model.patch_size[1])",
             (DINO_OPTIONS + "test_the_token_limit_counts_both_sides_of_a_non_square_patch",), "the token limit counts one side of the patch twice"),
    Mutation("dino", "vitkit/tasks/dino_options.py", "key = \"out_dim\" if 2 * last_layer > head else", "key = \"out_dim\" if 2 * last_layer >= head else",
             (DINO_OPTIONS + "test_the_parameter_limit_holds_at_twice_the_head_and_backbone_and_names_the_bigger_option",),
             "the refusal names out_dim when hidden_dim holds as many weights"),
    Mutation("classify", "vitkit/tasks/classify.py", ") * (tau * tau) / dist_logits.numel()", ") * tau / dist_logits.numel()",
             (CLS + "test_the_distillation_loss_is_deits",), "soft distillation scaled by tau, not tau squared"),
    Mutation("classify", "vitkit/tasks/classify.py", "mixup_switch_prob=optim.mixup_switch_prob,", "",
             (CLS + "test_from_recipe_threads_the_regularisers_distillation_and_test_time_augmentation",), "optim.mixup_switch_prob ignored"),
    Mutation("classify", "vitkit/tasks/classify.py", "        if len(views) > 1:", "        if len(views) > 2:",
             (CLS + "test_evaluation_averages_the_views_probabilities_and_reports_the_single_views_beside",),
             "hflip's single-view accuracy not reported"),
    Mutation("classify", "vitkit/tasks/classify.py", 'if self.tta == "hflip_shift":', 'if self.tta != "none":',
             (CLS + "test_the_summary_records_the_test_time_augmentation_and_its_single_view_accuracies",),
             "a mirrored-only accuracy recorded without moved views"),
    Mutation("classify", "vitkit/tasks/classify.py", "            model.set_distilled_training(True)", "            pass",
             (CLS + "test_distillation_trains_the_distillation_head_on_the_attached_teacher",),
             "a distillation token's head never trained on the teacher"),
    Mutation("tasks", "vitkit/tasks/mae.py", "        if self.decoder_dim % 4 or self.decoder_dim % self.decoder_heads:",
             "        if self.decoder_dim % 4 and self.decoder_dim % self.decoder_heads:",
             (MAE_REFUSE + "test_the_decoder_width_must_be_divisible_by_4_and_by_its_heads",), "a decoder width 4 does not divide accepted"),
    Mutation("tasks", "vitkit/tasks/mae.py", "def check_encoder(config: ViTConfig, norm_pix_loss: bool = False)",
             "def check_encoder(config: ViTConfig, norm_pix_loss: bool = True)",
             (MAE_REFUSE + "test_norm_pix_loss_needs_two_pixel_values_a_patch_and_is_off_by_default",),
             "one-pixel patches refused without norm_pix_loss"),
    Mutation("tasks", "vitkit/tasks/mae.py", "    return config.patch_size[0] * config.patch_size[1] * config.in_chans",
             "    return config.patch_size[1] * config.patch_size[1] * config.in_chans",
             (MAE_REFUSE + "test_norm_pix_loss_needs_two_pixel_values_a_patch_and_is_off_by_default",), "a patch's pixels counted as a square"),
    Mutation("tasks", "vitkit/tasks/mae.py", "        images = batch[0]\n        return StepOutput(self.loss(model, images), len(images))",
             "        images = batch[1]\n        return StepOutput(self.loss(model, images), len(images))",
             (MAE_REFUSE + "test_the_steps_weigh_a_batch_by_its_images_and_train_on_its_images",), "MAE trains on the labels"),
    Mutation("tasks", "vitkit/tasks/registry.py", "    return sorted(_TASKS)", "    return list(_TASKS)",
             (REGISTRY + "test_a_registered_task_is_found_by_its_name_which_it_learns",), "task names in registration order"),
    Mutation("tasks", "vitkit/tasks/registry.py", "        if known is not None and known is not cls:", "        if False:",
             (REGISTRY + "test_a_name_belongs_to_one_class_and_only_tasks_register",), "a second class takes a registered name"),
    Mutation("tasks", "vitkit/train/knn.py", "lr=1.0, max_iter=steps, line_search_fn", "lr=1.0, max_iter=1, line_search_fn",
             ("tests/train/test_knn.py::test_the_linear_probe_is_the_minimiser_of_its_regularised_loss_after_its_steps",),
             "the linear probe stops after one L-BFGS iteration"),
    # tasks as registered parts: the trainer reads each task's capabilities
    Mutation("registry", "vitkit/train/run.py", "    datamodule.task_data = module.task.split_data", "    pass",
             (DENSE_TASK,), "a task's own view of the data (its targets, DINO's crops) ignored"),
    Mutation("registry", "vitkit/train/run.py", "for name, part in module.task.released_parts().items():",
             "for name, part in {}.items():", (DENSE_TASK,), "the parts a task releases never written"),
    Mutation("registry", "vitkit/tasks/base.py", "for key, name in self.summary_metrics.items()}",
             'for key, name in {"test_acc": "test/acc1"}.items()}', (DENSE_TASK,),
             "summary.json's metrics classification's whatever the task"),
    Mutation("registry", "vitkit/train/config.py", "monitor=task.monitor)", 'monitor="val/loss")',
             (USER_TASK_RECIPE,), "a recipe without trainer.monitor selects by the loss, not the task's metric"),
    Mutation("registry", "vitkit/train/model_builder.py",
             "num_classes = 0 if config.task.task_class.releases_encoder else info.num_classes",
             "num_classes = info.num_classes", (USER_TASK,), "a task that releases an encoder exports a classifier"),
    Mutation("registry", "vitkit/train/pretraining.py", "    if task.releases_encoder:\n", "    if False:\n",
             (USER_TASK,), "an encoder released without its k-NN accuracy"),
    Mutation("registry", "vitkit/train/task_config.py", "        if self.name not in task_names():", "        if False:",
             (USER_TASK_RECIPE,), "an unknown task name refused without the registered names"),
    Mutation("registry", "vitkit/schema.py", "    fields = {f.name for f in dataclasses.fields(cls) if f.init} | set(_sections(cls))",
             "    fields = {f.name for f in dataclasses.fields(cls) if f.init}", (USER_TASK_RECIPE,),
             "a registered task's options section refused as an unknown key"),
    Mutation("dinoopt", "vitkit/train/distributed.py", "        _all_reduce(summed)\n        squares = ",
             "        squares = ", ("tests/train/test_sharded_training.py::"
                                   "test_per_parameter_clipping_takes_each_gradients_norm_over_the_ranks_shards",),
             "each sharded gradient clipped by its local shard's norm"),
    Mutation("dinoopt", "vitkit/train/distributed.py", "scales = (max_norm / (norms + 1e-6)).clamp(max=1.0)",
             "scales = max_norm / (norms + 1e-6)", (DINO_OPT + "test_per_param_clipping_equals_dinos_clip_gradients",),
             "per-parameter clipping scales small gradients up to the bound"),
    Mutation("dinoopt", "vitkit/train/module.py", '        if self.optim_config.clip_mode == "per_param":',
             "        if False:", (DINO_OPT + "test_per_param_clipping_equals_dinos_clip_gradients",),
             "optim.clip_mode=per_param ignored (global-norm clipping)"),
    Mutation("dinoopt", "vitkit/train/module.py", "                self.decay_schedule.apply(scheduler.last_epoch)",
             "                pass", (DINO_OPT + "test_a_dino_run_steps_the_decay_on_dinos_schedule_and_decays_the_position_embedding",),
             "optim.weight_decay_end ignored by a run (constant decay)"),
    Mutation("dinoopt", "vitkit/train/optim.py", "return half_cosine(min(1.0, step / max(1, self.horizon.total_steps))",
             "return half_cosine(min(1.0, (step + 1) / max(1, self.horizon.total_steps))",
             (DINO_OPT + "test_weight_decay_follows_dinos_cosine_scheduler_step_by_step",),
             "the weight-decay schedule a step ahead of DINO's"),
    Mutation("dinoopt", "vitkit/train/optim.py", 'self.decayed = [group["weight_decay"] > 0',
             'self.decayed = [group["weight_decay"] >= 0',
             (DINO_OPT + "test_weight_decay_follows_dinos_cosine_scheduler_step_by_step",),
             "the weight-decay schedule decays norms and biases"),
    Mutation("dinoopt", "vitkit/train/optim.py", "skip = set() if decay_embeddings else getattr(",
             "skip = getattr(", (DINO_OPT + "test_decay_embeddings_groups_equal_dinos_get_params_groups",),
             "optim.decay_embeddings ignored (pos_embed and cls_token exempt)"),
    Mutation("dinoopt", "vitkit/train/optim.py", "        if self.weight_decay_end is not None and self.weight_decay == 0:",
             "        if False:", (DINO_OPT + "test_a_weight_decay_schedule_from_no_decay_is_refused_in_one_line",),
             "a weight-decay schedule with no decayed group accepted and ignored"),
    Mutation("dinoopt", "vitkit/tasks/dino.py", '    monitor: ClassVar[str] = "last"\n', "",
             (DINO_OPT + "test_a_dino_recipe_without_a_monitor_releases_the_last_teacher",),
             "a DINO recipe without trainer.monitor releases the lowest-validation-loss teacher"),
)


def ignored(folder: str, names: list[str]) -> set[str]:
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
        for test in mutation.tests:
            file, _, name = test.partition("::")
            if not (ROOT / file).is_file():
                problems.append(f"{mutation.path}: {mutation.what}: no test file {file}")
            elif name and f"def {name.partition('[')[0]}(" not in (ROOT / file).read_text():
                problems.append(f"{mutation.path}: {mutation.what}: no test {name} in {file}")
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
        shutil.copytree(ROOT, work, ignore=ignored)
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
