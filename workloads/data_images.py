"""Image data: real digits that need no download, and ImageNet / CIFAR-10 from disk.

Default data: scikit-learn's ``load_digits`` (1,797 real 8x8 handwritten digits, 10
classes, bundled inside the package) upsampled bilinearly to the scale's image size and
repeated over three channels. A fixed 80/20 split (independent of the training seed, so every
run is evaluated on the same images) keeps time-to-accuracy comparable across systems.

Real data, in their usual on-disk formats:
- ImageNet as an ``ImageFolder``: ``<path>/train/<class>/*.JPEG`` and ``<path>/val/<class>/``;
  decoded on demand with the standard transforms (random-resized crop and flip for training,
  resize and centre crop for validation).
- CIFAR-10 binary version: ``data_batch_1.bin`` .. ``data_batch_5.bin`` and
  ``test_batch.bin`` (each record 1 label byte + 3,072 bytes of R, G, B planes), either
  directly in ``<path>`` or in ``<path>/cifar-10-batches-bin``.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import WorkloadError
from workloads.base import Batch, Dataset, DataSplits, TensorData

__all__ = ["CIFAR_MEAN", "CIFAR_STD", "IMAGENET_MEAN", "IMAGENET_STD", "ImageFolderData",
           "SPLIT_SEED", "cifar10", "digits", "image_batch", "image_folder", "load_images"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)
SPLIT_SEED = 20190901  # fixed: the validation images never depend on the training seed


def image_batch(data: Dataset, index: Tensor, targets_only: bool = False) -> Batch:
    if targets_only:
        return Batch((), data.take(index, ("y",))["y"])
    d = data.take(index)
    return Batch((d["x"],), d["y"])


def _normalise(x: Tensor, mean: tuple, std: tuple) -> Tensor:
    m = torch.tensor(mean).view(1, 3, 1, 1)
    s = torch.tensor(std).view(1, 3, 1, 1)
    return (x - m) / s


def _digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: (images [N, 8, 8], targets [N]), read from the CSV file the
    package ships, as its ``load_digits`` reads it, without importing the package: that
    import costs about 2 s of CPU here, in the launcher and again in every worker that
    loads the data, for a file read in milliseconds. Where the file is not where it was
    (another scikit-learn), ``load_digits`` itself."""
    spec = importlib.util.find_spec("sklearn")  # finds the package, does not import it
    csv = Path(spec.origin).parent / "datasets" / "data" / "digits.csv.gz" \
        if spec is not None and spec.origin else None
    if csv is None or not csv.is_file():
        from sklearn.datasets import load_digits

        raw = load_digits()
        return raw.images, raw.target
    data = np.loadtxt(csv, delimiter=",")  # a .gz is read through gzip
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)


def digits(image_size: int, seed: int) -> DataSplits:
    """The scikit-learn digits as 3 x S x S float images; ``seed`` is unused (fixed split)."""
    images, targets = _digits_arrays()
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)  # [N,1,8,8]
    x = torch.nn.functional.interpolate(x, size=(image_size, image_size), mode="bilinear",
                                        align_corners=False).repeat(1, 3, 1, 1)
    x = (x - 0.5) / 0.5
    y = torch.from_numpy(targets.astype(np.int64))
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(SPLIT_SEED))
    n_valid = len(y) // 5
    meta = {"num_classes": 10, "image_size": image_size}
    return DataSplits(
        train=TensorData({"x": x[perm[n_valid:]], "y": y[perm[n_valid:]]}, meta),
        valid=TensorData({"x": x[perm[:n_valid]], "y": y[perm[:n_valid]]}, meta),
        description=f"sklearn digits ({len(y) - n_valid} train / {n_valid} valid, "
                    f"{image_size}px)")


class ImageFolderData(Dataset):
    """An ImageFolder split decoded on demand (ImageNet does not fit in memory)."""

    def __init__(self, root: Path, image_size: int, train: bool) -> None:
        from torchvision import datasets, transforms

        norm = transforms.Normalize(IMAGENET_MEAN, IMAGENET_STD)
        if train:
            tf = transforms.Compose([transforms.RandomResizedCrop(image_size),
                                     transforms.RandomHorizontalFlip(), transforms.ToTensor(),
                                     norm])
        else:
            tf = transforms.Compose([transforms.Resize(int(round(image_size * 256 / 224))),
                                     transforms.CenterCrop(image_size), transforms.ToTensor(),
                                     norm])
        self.folder = datasets.ImageFolder(str(root), transform=tf)
        self.meta = {"num_classes": len(self.folder.classes), "image_size": image_size,
                     "classes": list(self.folder.classes)}

    def __len__(self) -> int:
        return len(self.folder)

    def take(self, index: Tensor, keys: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        if keys is not None and "x" not in keys:  # labels only: no image decoded
            return {"y": torch.tensor([self.folder.targets[int(i)] for i in index],
                                      dtype=torch.int64)}
        items = [self.folder[int(i)] for i in index]
        return {"x": torch.stack([im for im, _ in items]),
                "y": torch.tensor([label for _, label in items], dtype=torch.int64)}


def image_folder(path: str, image_size: int) -> DataSplits:
    root = Path(path)
    train_dir = root / "train"
    valid_dir = next((root / d for d in ("val", "valid", "validation") if (root / d).is_dir()),
                     None)
    if not train_dir.is_dir() or valid_dir is None:
        raise WorkloadError(f"{path}: expected an ImageFolder tree with train/<class>/ and "
                            "val/<class>/ (ImageNet layout)")
    train = ImageFolderData(train_dir, image_size, train=True)
    valid = ImageFolderData(valid_dir, image_size, train=False)
    if train.meta["classes"] != valid.meta["classes"]:
        raise WorkloadError(f"{path}: train/ and val/ have different class folders")
    return DataSplits(train, valid, f"ImageFolder {path} ({len(train)} train / {len(valid)} "
                                    f"val, {train.meta['num_classes']} classes)")


def _read_cifar_bin(file: Path) -> tuple[Tensor, Tensor]:
    raw = np.fromfile(file, dtype=np.uint8)
    if raw.size % 3073:
        raise WorkloadError(f"{file}: size {raw.size} is not a multiple of 3073 bytes; "
                            "is this the CIFAR-10 *binary* version?")
    rec = raw.reshape(-1, 3073)
    y = torch.from_numpy(rec[:, 0].astype(np.int64))
    x = torch.from_numpy(rec[:, 1:].reshape(-1, 3, 32, 32).astype(np.float32) / 255.0)
    return x, y


def cifar10(path: str, image_size: int) -> DataSplits:
    root = Path(path)
    if (root / "cifar-10-batches-bin").is_dir():
        root = root / "cifar-10-batches-bin"
    train_files = sorted(root.glob("data_batch_*.bin"))
    test_file = root / "test_batch.bin"
    if not train_files or not test_file.exists():
        raise WorkloadError(f"{path}: expected CIFAR-10 binaries data_batch_N.bin and "
                            "test_batch.bin")
    parts = [_read_cifar_bin(f) for f in train_files]
    xt, yt = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    xv, yv = _read_cifar_bin(test_file)

    def prep(x: Tensor) -> Tensor:
        if image_size != 32:
            x = torch.nn.functional.interpolate(x, size=(image_size, image_size),
                                                mode="bilinear", align_corners=False)
        return _normalise(x, CIFAR_MEAN, CIFAR_STD)

    meta = {"num_classes": 10, "image_size": image_size}
    return DataSplits(TensorData({"x": prep(xt), "y": yt}, meta),
                      TensorData({"x": prep(xv), "y": yv}, meta),
                      f"CIFAR-10 {path} ({len(yt)} train / {len(yv)} test)")


def load_images(path: str, image_size: int) -> DataSplits:
    """ImageFolder or CIFAR-10 binaries, whichever ``path`` holds."""
    root = Path(path)
    if not root.exists():
        raise WorkloadError(f"data path {path} does not exist")
    if (root / "train").is_dir():
        return image_folder(path, image_size)
    if list(root.glob("data_batch_*.bin")) or (root / "cifar-10-batches-bin").is_dir():
        return cifar10(path, image_size)
    raise WorkloadError(f"{path}: neither an ImageFolder (train/, val/) nor CIFAR-10 "
                        "binaries (data_batch_N.bin, test_batch.bin)")
