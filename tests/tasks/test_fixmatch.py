"""FixMatch (``vitkit.tasks.fixmatch``): the loss equals USB's FixMatch (written out below) on the
same logits; the threshold, the unlabeled term's weight and the soft labels' temperature do what
the paper says (hand-computed); the task pseudo-labels the weak view and trains the strong view on
it; the stream pairs ``mu`` unlabeled images with each labelled one and passes over each unlabeled
image once an epoch; the unlabeled images are the training images ``train_per_class`` leaves out,
or a folder's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from mnist_files import fabricate_mnist
from PIL import Image
from torch import nn
from torch.utils.data import DataLoader

from vitkit.data import ArrayDataset, DataConfig, build_datasets
from vitkit.data.config import AugmentConfig
from vitkit.data.unlabeled import FixMatchViews, SemiSupervisedStream, UnlabeledDataError, unlabeled_images
from vitkit.tasks.fixmatch import FixMatchOptions, FixMatchTask, fixmatch_loss

# ---- microsoft/Semi-supervised-learning (MIT): semilearn/core/criterions/cross_entropy.py ``ce_loss``,
# core/criterions/consistency.py ``consistency_loss`` ('ce'), algorithms/hooks/masking.py
# ``FixedThresholdingHook.masking``, algorithms/hooks/pseudo_label.py ``PseudoLabelingHook.gen_ulb_targets``
# and algorithms/fixmatch/fixmatch.py ``FixMatch.train_step``'s loss, as written there (the hooks'
# ``algorithm`` argument in place of ``self``; compute_prob is AlgorithmBase's softmax).


def ce_loss(logits, targets, reduction="none"):
    if logits.shape == targets.shape:
        log_pred = F.log_softmax(logits, dim=-1)
        nll_loss = torch.sum(-targets * log_pred, dim=1)
        if reduction == "none":
            return nll_loss
        else:
            return nll_loss.mean()
    else:
        log_pred = F.log_softmax(logits, dim=-1)
        return F.nll_loss(log_pred, targets, reduction=reduction)


def consistency_loss(logits, targets, name="ce", mask=None):
    loss = ce_loss(logits, targets, reduction="none")
    if mask is not None:
        loss = loss * mask
    return loss.mean()


def masking(p_cutoff, logits_x_ulb, softmax_x_ulb=True):
    if softmax_x_ulb:
        probs_x_ulb = torch.softmax(logits_x_ulb.detach(), dim=-1)
    else:
        probs_x_ulb = logits_x_ulb.detach()
    max_probs, _ = torch.max(probs_x_ulb, dim=-1)
    mask = max_probs.ge(p_cutoff).to(max_probs.dtype)
    return mask


def gen_ulb_targets(logits, use_hard_label=True, T=1.0, softmax=True):
    logits = logits.detach()
    if use_hard_label:
        pseudo_label = torch.argmax(logits, dim=-1)
        return pseudo_label
    if softmax:
        pseudo_label = torch.softmax(logits / T, dim=-1)
    else:
        pseudo_label = logits
    return pseudo_label


def usb_fixmatch_loss(logits_x_lb, y_lb, logits_x_ulb_w, logits_x_ulb_s, p_cutoff, lambda_u, use_hard_label, T):
    sup_loss = ce_loss(logits_x_lb, y_lb, reduction="mean")
    probs_x_ulb_w = torch.softmax(logits_x_ulb_w.detach(), dim=-1)
    mask = masking(p_cutoff, logits_x_ulb=probs_x_ulb_w, softmax_x_ulb=False)
    pseudo_label = gen_ulb_targets(logits=probs_x_ulb_w, use_hard_label=use_hard_label, T=T, softmax=False)
    unsup_loss = consistency_loss(logits_x_ulb_s, pseudo_label, "ce", mask=mask)
    total_loss = sup_loss + lambda_u * unsup_loss
    return total_loss, sup_loss, unsup_loss, mask


# ---- end of USB's code


def logits(seed: int, rows: int, classes: int = 6, scale: float = 4.0) -> torch.Tensor:
    return torch.randn(rows, classes, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


@pytest.mark.parametrize("threshold", [0.95, 0.7])
@pytest.mark.parametrize("lambda_u", [1.0, 0.3])
def test_the_loss_equals_usbs_fixmatch_on_the_same_logits(threshold: float, lambda_u: float) -> None:
    labelled, weak, strong = logits(0, 8), logits(1, 56), logits(2, 56, scale=2.0)
    labels = torch.randint(0, 6, (8,), generator=torch.Generator().manual_seed(3))
    total, sup, unsup, mask = usb_fixmatch_loss(labelled, labels, weak, strong, threshold, lambda_u, True, 0.5)
    ours = fixmatch_loss(labelled, labels, weak, strong, threshold=threshold, lambda_u=lambda_u)
    assert 0 < mask.mean() < 1  # some pseudo-labels pass, some do not: the mask matters
    torch.testing.assert_close(ours.mask.double(), mask)
    for mine, theirs in ((ours.total, total), (ours.supervised, sup), (ours.unsupervised, unsup)):
        torch.testing.assert_close(mine.double(), theirs, rtol=1e-6, atol=1e-6)


def test_soft_labels_at_temperature_one_equal_usbs_soft_labels() -> None:
    """USB's ``hard_label: false`` trains on the weak view's probabilities themselves (FixMatch
    passes probabilities to the hook, which then skips its temperature): temperature 1 here."""
    labelled, weak, strong = logits(4, 8), logits(5, 40), logits(6, 40)
    labels = torch.randint(0, 6, (8,), generator=torch.Generator().manual_seed(7))
    total, _, unsup, _ = usb_fixmatch_loss(labelled, labels, weak, strong, 0.7, 1.0, False, 0.5)
    ours = fixmatch_loss(labelled, labels, weak, strong, threshold=0.7, temperature=1.0)
    torch.testing.assert_close(ours.total.double(), total, rtol=1e-6, atol=1e-6)
    assert not torch.isclose(ours.unsupervised.double(), fixmatch_loss(labelled, labels, weak, strong, threshold=0.7)
                             .unsupervised.double())  # soft labels differ from hard ones


def test_the_threshold_masks_by_the_weak_views_confidence_hand_computed() -> None:
    weak = torch.log(torch.tensor([[0.96, 0.04], [0.90, 0.10], [0.02, 0.98], [0.5, 0.5]]))
    strong = torch.tensor([[0.0, 1.0], [2.0, 0.0], [1.0, 1.0], [3.0, -3.0]])
    labelled, labels = torch.zeros(1, 2), torch.tensor([0])
    out = fixmatch_loss(labelled, labels, weak, strong, threshold=0.95)
    assert out.mask.tolist() == [1.0, 0.0, 1.0, 0.0]
    # image 0: class 0 against strong logits (0, 1): log(1 + e); image 2: class 1 against (1, 1): log 2
    expected = (np.log(1 + np.e) + np.log(2)) / 4
    assert out.unsupervised.item() == pytest.approx(expected, rel=1e-6)
    assert out.total.item() == pytest.approx(np.log(2) + expected, rel=1e-6)
    below = fixmatch_loss(labelled, labels, weak, strong, threshold=0.99)  # nobody confident enough
    assert below.mask.sum() == 0 and below.unsupervised.item() == 0 and below.total.item() == pytest.approx(np.log(2))
    everyone = fixmatch_loss(labelled, labels, weak, strong, threshold=0.0)
    assert everyone.mask.tolist() == [1.0] * 4


def test_soft_labels_take_the_temperature_hand_computed() -> None:
    weak = torch.log(torch.tensor([[0.96, 0.04]]))
    strong = torch.tensor([[0.0, 1.0]])
    out = fixmatch_loss(torch.zeros(1, 2), torch.tensor([0]), weak, strong, threshold=0.95, temperature=0.5)
    target = np.array([0.96**2, 0.04**2]) / (0.96**2 + 0.04**2)  # softmax(log p / 0.5) = p^2 normalised
    log_q = np.array([0.0, 1.0]) - np.log(1 + np.e)
    assert out.unsupervised.item() == pytest.approx(-(target * log_q).sum(), rel=1e-6)


@pytest.mark.parametrize("lambda_u", [0.0, 1.0, 2.5])
def test_lambda_u_scales_the_unlabeled_gradient_by_hand(lambda_u: float) -> None:
    weak = torch.log(torch.tensor([[0.97, 0.03], [0.6, 0.4], [0.01, 0.99]]))
    strong = torch.tensor([[0.5, 0.2], [1.0, -1.0], [0.3, 0.3]], requires_grad=True)
    labelled = torch.tensor([[1.0, 0.0]], requires_grad=True)
    fixmatch_loss(labelled, torch.tensor([1]), weak, strong, threshold=0.95, lambda_u=lambda_u).total.backward()
    # d/dz CE(z, y) = softmax(z) - onehot(y); masked rows 0 and 2 (labels 0 and 1), each over U = 3 images
    probs = torch.softmax(strong.detach(), dim=-1)
    expected = torch.zeros(3, 2)
    expected[0] = (probs[0] - torch.tensor([1.0, 0.0])) / 3 * lambda_u
    expected[2] = (probs[2] - torch.tensor([0.0, 1.0])) / 3 * lambda_u
    torch.testing.assert_close(strong.grad, expected)
    torch.testing.assert_close(labelled.grad, torch.softmax(labelled.detach(), -1) - torch.tensor([[0.0, 1.0]]))


# ------------------------------------------------------------------------------- the task

MEAN, STD = (0.5,), (0.25,)


def info_of(size: int = 8) -> object:
    from vitkit.data.info import DataInfo

    return DataInfo(num_classes=3, class_names=("a", "b", "c"), img_size=(size, size), in_chans=1, mean=MEAN,
                    std=STD, name="test")


class Recorder(nn.Module):
    """A linear classifier on the flattened image that records what each forward saw, and whether
    gradients were on."""

    def __init__(self, pixels: int, classes: int = 3) -> None:
        super().__init__()
        self.linear = nn.Linear(pixels, classes)
        self.seen: list[tuple[torch.Tensor, bool]] = []

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        self.seen.append((images.detach().clone(), torch.is_grad_enabled()))
        return self.linear(images.flatten(1)) * 2


def fixmatch_task(options: FixMatchOptions, augment: AugmentConfig | None = None, ops: int = 3) -> FixMatchTask:
    views = FixMatchViews(augment or AugmentConfig(enabled=False), info_of(), strong_ops=ops, cutout=0.5)
    return FixMatchTask(views, lambda: np.zeros((0, 8, 8, 1), np.uint8), options)


def random_batch(mu: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    rng = np.random.default_rng(seed)
    labelled = torch.from_numpy(rng.integers(0, 256, (4, 8, 8, 1), dtype=np.uint8))
    unlabeled = torch.from_numpy(rng.integers(0, 256, (4, mu, 8, 8, 1), dtype=np.uint8))
    return labelled, torch.tensor([0, 1, 2, 0]), unlabeled, torch.arange(4 * mu).view(4, mu)


def test_the_weak_view_pseudo_labels_the_strong_view_which_alone_learns() -> None:
    task = fixmatch_task(FixMatchOptions(threshold=0.5, mu=2))
    model = Recorder(64)
    labelled, labels, unlabeled, indices = random_batch(mu=2)
    torch.manual_seed(0)
    out = task.training_step(model, (labelled, labels, unlabeled, indices))
    (weak_in, weak_grad), (joint_in, joint_grad) = model.seen
    normalised = (unlabeled.flatten(0, 1).permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25  # no weak augmentation here
    assert not weak_grad and joint_grad  # pseudo-labels without gradient, the labelled and strong views with
    torch.testing.assert_close(weak_in, normalised)
    torch.testing.assert_close(joint_in[:4], (labelled.permute(0, 3, 1, 2).float() / 255 - 0.5) / 0.25)
    strong_in = joint_in[4:]
    assert strong_in.shape == normalised.shape and not torch.allclose(strong_in, normalised)  # RandAugment + Cutout
    torch.manual_seed(0)
    task.views.weak(unlabeled.flatten(0, 1))  # the same draws in the same order give the same strong views
    torch.testing.assert_close(strong_in, task.views.strong(unlabeled.flatten(0, 1)))
    with torch.no_grad():
        expected = fixmatch_loss(model.linear(joint_in[:4].flatten(1)) * 2, labels, model.linear(weak_in.flatten(1)) * 2,
                                 model.linear(strong_in.flatten(1)) * 2, threshold=0.5)
    assert 0 < expected.mask.mean() < 1 and expected.unsupervised > 0
    torch.testing.assert_close(out.loss.detach(), expected.total)
    torch.testing.assert_close(out.metrics["loss_unlabeled"], expected.unsupervised)
    assert out.metrics["mask_rate"].item() == pytest.approx(expected.mask.mean().item())
    assert out.batch_size == 4


def test_the_task_reads_threshold_and_lambda_u_from_its_options() -> None:
    batch = random_batch(mu=3, seed=1)
    losses = {}
    for key, options in {"base": FixMatchOptions(threshold=0.5, mu=3), "strict": FixMatchOptions(threshold=1.0, mu=3),
                         "unweighted": FixMatchOptions(threshold=0.5, mu=3, lambda_u=0.0)}.items():
        torch.manual_seed(0)
        model = Recorder(64)
        torch.manual_seed(1)
        out = fixmatch_task(options).training_step(model, batch)
        losses[key] = (out.loss.item(), out.metrics["loss_labelled"].item(), out.metrics["loss_unlabeled"].item())
    assert losses["base"][2] > 0
    assert losses["strict"][2] == 0 and losses["strict"][0] == pytest.approx(losses["strict"][1])
    assert losses["unweighted"][0] == pytest.approx(losses["unweighted"][1]) and losses["unweighted"][2] > 0
    assert losses["base"][0] == pytest.approx(losses["base"][1] + losses["base"][2])


def test_the_weak_view_is_the_data_sections_flip_and_shift_and_the_strong_view_adds_its_operations() -> None:
    views = FixMatchViews(AugmentConfig(crop="pad", padding=2, hflip=0.5), info_of(), strong_ops=2, cutout=0.25)
    assert (views.weak.padding, views.weak.hflip, views.weak.rand_augment) == (2, 0.5, None)
    assert (views.strong.padding, views.strong.hflip) == (2, 0.5)
    assert (views.strong.rand_augment.num_ops, views.strong.rand_augment.cutout) == (2, 0.25)
    assert views.strong.rand_augment.fill.flatten().tolist() == [127.5]  # the mean colour: 0 once normalised
    with pytest.raises(ValueError, match="random_resized"):
        FixMatchViews(AugmentConfig(crop="random_resized", hflip=0.5), info_of())


# ------------------------------------------------------------------------------- the data

def stream(labelled: int = 5, unlabeled: int = 24, mu: int = 3) -> SemiSupervisedStream:
    images = np.zeros((labelled, 4, 4, 1), np.uint8)
    images[:, 0, 0, 0] = np.arange(labelled)
    extra = np.zeros((unlabeled, 4, 4, 1), np.uint8)
    extra[:, 0, 0, 0] = np.arange(unlabeled)
    dataset = ArrayDataset(images, np.arange(labelled) % 3, lambda image: torch.zeros(1), None)
    return SemiSupervisedStream(dataset, extra, mu)


def test_mu_sets_the_unlabeled_batch_and_an_epoch_passes_over_each_unlabeled_image_once() -> None:
    data = stream(labelled=5, unlabeled=24, mu=3)
    assert len(data) == 8
    torch.manual_seed(0)
    batches = list(DataLoader(data, batch_size=2, shuffle=True))
    assert len(batches) == 4
    seen_unlabeled, seen_labelled = [], []
    for labelled, labels, unlabeled, indices in batches:
        assert labelled.shape == (2, 4, 4, 1) and labelled.dtype == torch.uint8
        assert unlabeled.shape == (2, 3, 4, 4, 1)  # mu x the labelled batch
        assert indices.tolist() == unlabeled[..., 0, 0, 0].tolist()  # each image's index is its place: FlexMatch's record
        seen_unlabeled += unlabeled[..., 0, 0, 0].flatten().tolist()
        seen_labelled += labelled[:, 0, 0, 0].tolist()
        assert labels.tolist() == [value % 3 for value in labelled[:, 0, 0, 0].tolist()]
    assert sorted(seen_unlabeled) == list(range(24))
    assert sorted(seen_labelled) == [0, 0, 1, 1, 2, 2, 3, 4]  # samples 0..7 read labelled images i mod 5
    second = [value for _, _, unlabeled, _ in DataLoader(data, batch_size=2, shuffle=True)
              for value in unlabeled[..., 0, 0, 0].flatten().tolist()]
    assert sorted(second) == list(range(24)) and second != seen_unlabeled  # a new order each pass


def test_too_few_unlabeled_images_for_mu_are_refused() -> None:
    with pytest.raises(UnlabeledDataError, match="mu=7"):
        stream(unlabeled=5, mu=7)


def test_the_unlabeled_images_are_the_training_images_train_per_class_leaves_out(tmp_path: Path) -> None:
    fabricate_mnist(tmp_path, per_class=12)
    config = DataConfig(name="fashion_mnist", root=str(tmp_path), train_per_class=3, val_fraction=0.25, seed=4)
    bundle = build_datasets(config)
    every = build_datasets(DataConfig(name="fashion_mnist", root=str(tmp_path), val_fraction=0.25, seed=4)).train
    rest = unlabeled_images(config, bundle.info)
    ids = lambda images: images[:, 27, 27, 0].tolist()  # noqa: E731  (the fabricated images' index pixel)
    assert len(rest) == 90 - 30 and len(bundle.train) == 30  # 9 training images a class, 3 labelled
    assert not set(ids(rest)) & set(ids(bundle.train.images))
    assert sorted(ids(rest) + ids(bundle.train.images)) == sorted(ids(every.images))
    assert not set(ids(rest)) & set(ids(bundle.val.images))  # validation stays out


def test_an_unlabeled_folder_is_read_whole_at_the_runs_size_and_channels(tmp_path: Path) -> None:
    folder = tmp_path / "unlabeled"
    (folder / "deeper").mkdir(parents=True)
    for index in range(5):
        Image.fromarray(np.full((12, 16, 3), 40 * index, np.uint8)).save(folder / ("deeper" if index % 2 else "") / f"{index}.png")
    images = unlabeled_images(DataConfig(name="digits"), info_of(8), str(folder))
    assert images.shape == (5, 8, 8, 1) and images.dtype == np.uint8
    assert sorted(int(image.mean()) for image in images) == [0, 40, 80, 120, 160]


def test_without_unlabeled_images_the_run_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(UnlabeledDataError, match="data.train_per_class .* or task.fixmatch.unlabeled_root"):
        unlabeled_images(DataConfig(name="digits"), info_of())
    (tmp_path / "empty").mkdir()
    with pytest.raises(UnlabeledDataError, match="holds no images"):
        unlabeled_images(DataConfig(name="digits"), info_of(), str(tmp_path / "empty"))
