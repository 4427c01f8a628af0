"""Real-dataset loaders, each on tiny files written here in the dataset's usual format."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import WorkloadError
from workloads import data_images, data_seq2seq, data_text
from workloads.registry import get


def test_the_digits_are_scikit_learn_s_own_without_importing_it() -> None:
    """The default image data read from scikit-learn's bundled file equal its
    ``load_digits`` (the reference), and reading them imports no scikit-learn."""
    import subprocess
    import sys

    from sklearn.datasets import load_digits

    images, targets = data_images._digits_arrays()
    ref = load_digits()
    assert images.dtype == ref.images.dtype and np.array_equal(images, ref.images)
    assert targets.dtype == ref.target.dtype and np.array_equal(targets, ref.target)
    probe = ("import sys; from workloads.data_images import digits; digits(32, 0); "
             "print('sklearn' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                       check=True, cwd=Path(__file__).resolve().parents[2])
    assert r.stdout.strip() == "False"


def test_image_folder(tmp_path: Path) -> None:
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, n in (("train", 3), ("val", 2)):
        for cls in ("n01440764", "n01443537"):
            d = tmp_path / split / cls
            d.mkdir(parents=True)
            for i in range(n):
                Image.fromarray(rng.integers(0, 255, (40, 50, 3), dtype=np.uint8)).save(
                    d / f"{cls}_{i}.JPEG", format="JPEG")
    splits = data_images.load_images(str(tmp_path), 32)
    assert len(splits.train) == 6 and len(splits.valid) == 4
    assert splits.train.meta["classes"] == ["n01440764", "n01443537"]
    b = data_images.image_batch(splits.valid, torch.tensor([0, 3]))
    assert b.inputs[0].shape == (2, 3, 32, 32) and b.targets.tolist() == [0, 1]
    model = get("vgg16").build("tiny", splits.train.meta).eval()
    assert model(b.inputs)[0].shape == (2, 2)
    # a pipeline's last stage asks for the labels alone: no image is opened for them
    opened = []
    loader = splits.valid.folder.loader
    splits.valid.folder.loader = lambda path: opened.append(path) or loader(path)
    only = data_images.image_batch(splits.valid, torch.tensor([3, 0]), targets_only=True)
    assert only.inputs == () and only.targets.tolist() == [1, 0] and opened == []


@pytest.mark.parametrize("name", ["vgg16", "resnet50", "gnmt8", "awd-lm", "s2vt", "gpt"])
def test_targets_only_are_the_whole_batchs_targets(name: str) -> None:
    """What a last stage reads alone (``targets_only``) is what the whole minibatch holds,
    for every workload's built-in data."""
    from workloads.recipe import epoch_order, load_splits, microbatch

    wl = get(name)
    data = load_splits(wl, "tiny", None, 0).train
    order = epoch_order(len(data), 0, 1)
    for j in range(2):
        whole = microbatch(data, wl, order, 1, j, 8, 2)
        alone = microbatch(data, wl, order, 1, j, 8, 2, targets_only=True)
        assert alone.inputs == () and alone.targets.dtype == whole.targets.dtype
        assert torch.equal(alone.targets, whole.targets)


def test_cifar10_binary(tmp_path: Path) -> None:
    root = tmp_path / "cifar-10-batches-bin"
    root.mkdir()
    rng = np.random.default_rng(1)
    labels = {}
    for name, n in (("data_batch_1.bin", 5), ("data_batch_2.bin", 4), ("test_batch.bin", 3)):
        rec = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
        rec[:, 0] = rng.integers(0, 10, n)
        rec.tofile(root / name)
        labels[name] = rec
    splits = data_images.load_images(str(tmp_path), 32)
    assert len(splits.train) == 9 and len(splits.valid) == 3
    assert splits.train.take(torch.arange(9))["y"].tolist() == (
        labels["data_batch_1.bin"][:, 0].tolist() + labels["data_batch_2.bin"][:, 0].tolist())
    # Pixel (channel 0, row 0, col 1) of the first test image, normalised with CIFAR stats.
    raw = labels["test_batch.bin"][0, 1 + 1] / 255.0
    x = splits.valid.take(torch.tensor([0]))["x"]
    expected = (raw - data_images.CIFAR_MEAN[0]) / data_images.CIFAR_STD[0]
    assert x[0, 0, 0, 1].item() == pytest.approx(expected, abs=1e-5)


def test_cifar10_rejects_a_truncated_file(tmp_path: Path) -> None:
    (tmp_path / "data_batch_1.bin").write_bytes(b"\0" * 100)
    (tmp_path / "test_batch.bin").write_bytes(b"\0" * 3073)
    with pytest.raises(WorkloadError, match="multiple of 3073"):
        data_images.load_images(str(tmp_path), 32)


def test_missing_or_unrecognised_image_path(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="does not exist"):
        data_images.load_images(str(tmp_path / "nope"), 32)
    with pytest.raises(WorkloadError, match="neither an ImageFolder"):
        data_images.load_images(str(tmp_path), 32)


def test_ptb(tmp_path: Path) -> None:
    (tmp_path / "ptb.train.txt").write_text(" the cat sat \n the <unk> ran \n")
    (tmp_path / "ptb.valid.txt").write_text(" the dog sat \n")
    splits = data_text.ptb(str(tmp_path), bptt=3)
    vocab = splits.train.meta["vocab"]
    assert vocab == ["the", "cat", "sat", "<eos>", "<unk>", "ran"]
    # train stream: the cat sat <eos> the <unk> ran <eos>  -> 2 windows of 3
    x = splits.train.take(torch.arange(2))["x"]
    y = splits.train.take(torch.arange(2))["y"]
    assert x.tolist() == [[0, 1, 2], [3, 0, 4]] and y.tolist() == [[1, 2, 3], [0, 4, 5]]
    # "dog" is unknown in validation: mapped to <unk>
    assert splits.valid.take(torch.tensor([0]))["x"].tolist() == [[0, 4, 2]]


def test_wmt16_bpe_pairs(tmp_path: Path) -> None:
    for prefix, en, de in (("train.tok.clean.bpe.32000", ["a b@@ c", "d"], ["x y", "z z"]),
                           ("newstest2014.tok.bpe.32000", ["a d"], ["y@@ x"])):
        (tmp_path / f"{prefix}.en").write_text("\n".join(en) + "\n")
        (tmp_path / f"{prefix}.de").write_text("\n".join(de) + "\n")
    splits = data_seq2seq.wmt16(str(tmp_path), max_len=4)
    itos = splits.train.meta["itos"]
    assert itos[:4] == data_seq2seq.SPECIALS and len(itos) == 4 + 7
    t = splits.train.take(torch.tensor([0]))
    stoi = {w: i for i, w in enumerate(itos)}
    assert t["src"].tolist() == [[stoi["a"], stoi["b@@"], stoi["c"], 0]]
    assert t["tgt_in"].tolist() == [[data_seq2seq.BOS, stoi["x"], stoi["y"], 0, 0]]
    assert t["tgt_out"].tolist() == [[stoi["x"], stoi["y"], data_seq2seq.EOS, 0, 0]]
    assert len(splits.valid) == 1


def test_msvd_features_and_captions(tmp_path: Path) -> None:
    feats = tmp_path / "features"
    feats.mkdir()
    rows = []
    for v in range(5):
        vid = ("clip", str(v), str(v + 3))
        np.save(feats / f"{'_'.join(vid)}.npy", np.full((6 + v, 16), v, dtype=np.float32))
        rows.append([*vid, "1", "clean", "5", "English", f"A man plays guitar {v}."])
        rows.append([*vid, "2", "clean", "5", "German", "Ein Mann."])
        rows.append([*vid, "3", "clean", "5", "English", "Someone is playing."])
    with open(tmp_path / "captions.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["VideoID", "Start", "End", "WorkerID", "Source", "AnnotationTime",
                    "Language", "Description"])
        w.writerows(rows)
    (tmp_path / "split.json").write_text(json.dumps({"train": ["clip_0_3", "clip_1_4",
                                                               "clip_2_5"],
                                                     "valid": ["clip_4_7"]}))
    splits = data_seq2seq.msvd(str(tmp_path), frames=4, max_words=6)
    assert len(splits.train) == 6  # 3 clips x 2 English captions
    assert len(splits.valid) == 1
    assert splits.valid.meta["references"][0] == ["a man plays guitar 4", "someone is playing"]
    clip = splits.valid.take(torch.tensor([0]))["src"]
    assert clip.shape == (1, 4, 16) and torch.all(clip == 4)  # 10 frames subsampled to 4
    model = get("s2vt").build("tiny", splits.train.meta).eval()
    b = data_seq2seq.seq2seq_batch(splits.train, torch.arange(2))
    assert model(b.inputs)[0].shape == (2, 7, splits.train.meta["vocab_size"])


def test_seq2seq_loaders_name_the_expected_files(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match="train.tok.clean.bpe.32000"):
        data_seq2seq.wmt16(str(tmp_path), 50)
    with pytest.raises(WorkloadError, match="captions.csv"):
        data_seq2seq.msvd(str(tmp_path), 4, 6)
    with pytest.raises(WorkloadError, match="ptb.train.txt"):
        data_text.ptb(str(tmp_path), 35)
