"""Token streams for the GPT workloads: the formats people train small GPTs on.

Their default data is not here: it is AWD-LM's Markov source
(``data_text.markov_default``), whose best reachable perplexity is known in closed form.

Real data (``--data PATH``), cut into windows of ``seq`` tokens (x = w[0:T], y = w[1:T+1],
consecutive windows, as the language-model workloads do):

- a directory holding ``train.bin`` and ``val.bin``: the nanoGPT / llm.c layout, a flat
  array of little-endian uint16 token ids with no header (what nanoGPT's ``prepare.py``
  writes with GPT-2's tokenizer). Both are memory-mapped: a window is read when a batch
  asks for it, so OpenWebText's 9B tokens need no RAM. The vocabulary is ``vocab_size``
  from nanoGPT's ``meta.pkl`` where the directory has one (its character-level sets),
  else GPT-2's 50,257; ids are checked against it on ``val.bin`` only (reading all of
  ``train.bin`` would read 18 GB for OpenWebText, in every process).
- a UTF-8 text file, or a directory holding ``train.txt`` and ``val.txt``: byte-level
  tokens (each byte an id, vocabulary 256: no tokenizer to download); a single file is
  split 90/10 into training and validation text.
"""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import WorkloadError
from workloads.base import Dataset, DataSplits

__all__ = ["BYTE_VOCAB", "GPT2_VOCAB", "TokenWindows", "load", "read_bin"]

BYTE_VOCAB = 256
GPT2_VOCAB = 50257  # GPT-2's BPE tokenizer: what nanoGPT's and llm.c's .bin files hold
VALID_SHARE = 0.1  # of a single text file, held out for validation


class TokenWindows(Dataset):
    """Consecutive windows of ``seq`` tokens over a 1-D array of token ids (a memory map
    or an in-memory array); ``take`` reads only the windows asked for."""

    def __init__(self, tokens: np.ndarray, seq: int, meta: dict) -> None:
        self.n = (len(tokens) - 1) // seq
        if self.n < 1:
            raise WorkloadError(f"{len(tokens)} tokens are fewer than one window of {seq} + 1")
        self.tokens, self.seq, self.meta = tokens, seq, meta

    def __len__(self) -> int:
        return self.n

    def take(self, index: Tensor, keys: tuple[str, ...] | None = None) -> dict[str, Tensor]:
        rows = index.numpy()[:, None] * self.seq + np.arange(self.seq + 1)
        w = torch.from_numpy(self.tokens[rows].astype(np.int64))
        return {k: v for k, v in (("x", w[:, :-1]), ("y", w[:, 1:]))
                if keys is None or k in keys}


def read_bin(file: Path) -> np.ndarray:
    """A nanoGPT token file: uint16 ids, memory-mapped."""
    size = file.stat().st_size
    if size == 0 or size % 2:
        raise WorkloadError(f"{file}: {size} bytes is not a whole, non-zero number of "
                            "uint16 token ids (nanoGPT's train.bin/val.bin layout)")
    return np.memmap(file, dtype=np.uint16, mode="r")


def _bin_vocab(root: Path, valid: np.ndarray) -> int:
    meta = root / "meta.pkl"
    if meta.exists():
        with open(meta, "rb") as f:  # nanoGPT's own file, next to the data it describes
            vocab = int(pickle.load(f)["vocab_size"])
    else:
        vocab = GPT2_VOCAB
    if int(valid.max()) >= vocab:
        raise WorkloadError(f"{root}: val.bin holds token id {int(valid.max())}, outside the "
                            f"vocabulary of {vocab} (GPT-2's, or meta.pkl's vocab_size)")
    return vocab


def _bytes(file: Path) -> np.ndarray:
    return np.frombuffer(file.read_bytes(), dtype=np.uint8)


def load(path: str, seq: int) -> DataSplits:
    root = Path(path)
    if root.is_dir() and (root / "train.bin").exists() and (root / "val.bin").exists():
        train, valid = read_bin(root / "train.bin"), read_bin(root / "val.bin")
        vocab, kind = _bin_vocab(root, valid), "uint16 token ids"
    elif root.is_dir() and (root / "train.txt").exists() and (root / "val.txt").exists():
        train, valid = _bytes(root / "train.txt"), _bytes(root / "val.txt")
        vocab, kind = BYTE_VOCAB, "UTF-8 bytes"
    elif root.is_file() and root.suffix == ".bin":
        raise WorkloadError(f"{path}: give the directory holding train.bin and val.bin, "
                            "not one .bin file (it would be read as text)")
    elif root.is_file():
        text = _bytes(root)
        cut = int(len(text) * (1 - VALID_SHARE))
        train, valid = text[:cut], text[cut:]
        vocab, kind = BYTE_VOCAB, f"UTF-8 bytes, last {VALID_SHARE:.0%} held out"
    else:
        raise WorkloadError(f"{path}: expected a directory with train.bin and val.bin "
                            "(nanoGPT's uint16 token ids), a directory with train.txt and "
                            "val.txt, or one UTF-8 text file")
    meta = {"vocab_size": vocab}
    return DataSplits(TokenWindows(train, seq, meta), TokenWindows(valid, seq, meta),
                      f"{path} ({kind}: {len(train)} train / {len(valid)} valid tokens, "
                      f"vocabulary {vocab})")
