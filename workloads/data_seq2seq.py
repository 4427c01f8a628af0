"""Sequence-to-sequence data: translation (GNMT) and video captioning (S2VT).

Shared conventions: token ids PAD=0, UNK=1, BOS=2, EOS=3; a target is fed as
``tgt_in = [BOS] + words`` and predicted as ``tgt_out = words + [EOS]``, padded with PAD to a
fixed length (fixed shapes let pipeline stages exchange tensors of known size).

Default data (no download, deterministic, learnable):
- translation: source sentences from a Markov chain over source words; the "translation"
  maps every word through a fixed bilingual dictionary and swaps each adjacent pair (a local
  reordering that only attention solves well);
- captioning: each clip shows a (subject, verb, object) triple; frame features are the sum of
  the three concepts' prototype vectors (the verb's modulated over time) plus noise; the
  references are "a S is V a O" and "the S is V the O".

Real data, usual formats:
- WMT16 EN-DE as prepared by the MLPerf/NVIDIA GNMT scripts: ``train.tok.clean.bpe.32000.en``
  / ``.de`` and ``newstest2014.tok.bpe.32000.en`` / ``.de`` (plain ``train.en``/``valid.en``
  also accepted), optional ``vocab.bpe.32000`` (one token per line);
- MSVD: ``features/<video_id>.npy`` ([frames, dim] float arrays, e.g. VGG fc7) and
  ``captions.csv`` in the "MSR Video Description Corpus" format (VideoID, Start, End, WorkerID,
  Source, AnnotationTime, Language, Description), where video_id = VideoID_Start_End. Splits
  from ``split.json`` ({"train": [...], "valid": [...]}) if present, else the standard
  1200/100 order of first appearance.
"""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import WorkloadError
from workloads.base import Batch, Dataset, DataSplits, TensorData

__all__ = ["SPECIALS", "SYNTH_SEED", "msvd", "pad_source", "pad_targets", "seq2seq_batch",
           "strip_tokens", "synthetic_captions", "synthetic_translation", "wmt16"]

PAD, UNK, BOS, EOS = 0, 1, 2, 3
SPECIALS = ["<pad>", "<unk>", "<s>", "</s>"]
SYNTH_SEED = 8


def pad_targets(sentences: list[list[int]], length: int) -> tuple[Tensor, Tensor]:
    """(tgt_in, tgt_out), each [N, length]; sentences longer than length-1 are cut."""
    n = len(sentences)
    tgt_in = torch.full((n, length), PAD, dtype=torch.int64)
    tgt_out = torch.full((n, length), PAD, dtype=torch.int64)
    for i, s in enumerate(sentences):
        s = s[: length - 1]
        tgt_in[i, : len(s) + 1] = torch.tensor([BOS] + s)
        tgt_out[i, : len(s) + 1] = torch.tensor(s + [EOS])
    return tgt_in, tgt_out


def pad_source(sentences: list[list[int]], length: int) -> Tensor:
    src = torch.full((len(sentences), length), PAD, dtype=torch.int64)
    for i, s in enumerate(sentences):
        s = s[:length]
        src[i, : len(s)] = torch.tensor(s)
    return src


def seq2seq_batch(data: Dataset, index: Tensor, targets_only: bool = False) -> Batch:
    """Inputs (source, tgt_in), targets tgt_out: works for translation and captioning."""
    if targets_only:
        return Batch((), data.take(index, ("tgt_out",))["tgt_out"])
    d = data.take(index)
    return Batch((d["src"], d["tgt_in"]), d["tgt_out"])


def strip_tokens(ids: list[int]) -> list[int]:
    """Cut at the first EOS and drop specials."""
    out = []
    for t in ids:
        if t == EOS:
            break
        if t > EOS:
            out.append(t)
    return out


# ------------------------------------------------------------------------- translation

def synthetic_translation(words: int, n_train: int, n_valid: int, min_len: int, max_len: int,
                          seed: int) -> DataSplits:
    """Vocabulary: 4 specials, then ``words`` source words, then ``words`` target words."""
    rng = np.random.default_rng(SYNTH_SEED)
    trans = rng.dirichlet(np.full(words, 0.3), size=words)
    dictionary = rng.permutation(words)

    def sentence(r: np.random.Generator) -> tuple[list[int], list[int]]:
        n = int(r.integers(min_len, max_len + 1))
        w = [int(r.integers(words))]
        for _ in range(n - 1):
            w.append(int(r.choice(words, p=trans[w[-1]])))
        tgt = [int(dictionary[x]) for x in w]
        for i in range(0, n - 1, 2):
            tgt[i], tgt[i + 1] = tgt[i + 1], tgt[i]
        return [4 + x for x in w], [4 + words + x for x in tgt]

    def split(n: int, r: np.random.Generator) -> TensorData:
        pairs = [sentence(r) for _ in range(n)]
        tgt_in, tgt_out = pad_targets([t for _, t in pairs], max_len + 1)
        return TensorData({"src": pad_source([s for s, _ in pairs], max_len),
                           "tgt_in": tgt_in, "tgt_out": tgt_out}, meta)

    meta = {"vocab_size": 4 + 2 * words, "src_len": max_len, "tgt_len": max_len + 1}
    train = split(n_train, np.random.default_rng(SYNTH_SEED + 1))
    valid = split(n_valid, np.random.default_rng(SYNTH_SEED + 2))
    return DataSplits(train, valid, f"synthetic translation ({words} words per side, lengths "
                                    f"{min_len}-{max_len}, {n_train} train / {n_valid} valid)")


def _find(root: Path, names: list[str]) -> Path | None:
    return next((root / n for n in names if (root / (n + ".en")).exists()
                 and (root / (n + ".de")).exists()), None)


def wmt16(path: str, max_len: int, src_lang: str = "en", tgt_lang: str = "de") -> DataSplits:
    root = Path(path)
    train = _find(root, ["train.tok.clean.bpe.32000", "train.tok.clean", "train"])
    valid = _find(root, ["newstest2014.tok.bpe.32000", "newstest_dev.tok.clean.bpe.32000",
                         "newstest2014", "valid", "dev"])
    if train is None or valid is None:
        raise WorkloadError(f"{path}: expected WMT16 pairs train.tok.clean.bpe.32000.{{en,de}} "
                            "and newstest2014.tok.bpe.32000.{en,de} (or train.{en,de}, "
                            "valid.{en,de})")

    def read(prefix: Path, lang: str) -> list[list[str]]:
        with open(f"{prefix}.{lang}", encoding="utf-8") as f:
            return [line.split() for line in f]

    vocab_file = root / "vocab.bpe.32000"
    if vocab_file.exists():
        tokens = [line.strip() for line in open(vocab_file, encoding="utf-8") if line.strip()]
    else:
        tokens = list(dict.fromkeys(w for lang in (src_lang, tgt_lang)
                                    for s in read(train, lang) for w in s))
    itos = SPECIALS + [t for t in tokens if t not in SPECIALS]
    stoi = {t: i for i, t in enumerate(itos)}
    meta = {"vocab_size": len(itos), "itos": itos, "src_len": max_len, "tgt_len": max_len + 1,
            "bpe": True}

    def split(prefix: Path) -> TensorData:
        src = [[stoi.get(w, UNK) for w in s] for s in read(prefix, src_lang)]
        tgt = [[stoi.get(w, UNK) for w in s] for s in read(prefix, tgt_lang)]
        if len(src) != len(tgt):
            raise WorkloadError(f"{prefix}: {len(src)} source but {len(tgt)} target lines")
        keep = [i for i in range(len(src)) if 0 < len(src[i]) <= max_len
                and 0 < len(tgt[i]) <= max_len]
        tgt_in, tgt_out = pad_targets([tgt[i] for i in keep], max_len + 1)
        return TensorData({"src": pad_source([src[i] for i in keep], max_len),
                           "tgt_in": tgt_in, "tgt_out": tgt_out}, meta)

    tr, va = split(train), split(valid)
    return DataSplits(tr, va, f"WMT16 {src_lang}-{tgt_lang} {path} ({len(tr)} train / "
                              f"{len(va)} valid pairs, vocabulary {len(itos)})")


# ------------------------------------------------------------------------- captioning

def synthetic_captions(concepts: int, frames: int, feat_dim: int, n_train: int, n_valid: int,
                       noise: float, seed: int) -> DataSplits:
    words = ["a", "the", "is"]
    subj = [f"s{i}" for i in range(concepts)]
    verb = [f"v{i}" for i in range(concepts)]
    obj = [f"o{i}" for i in range(concepts)]
    itos = SPECIALS + words + subj + verb + obj
    stoi = {w: i for i, w in enumerate(itos)}
    rng = np.random.default_rng(SYNTH_SEED)
    proto = {k: rng.standard_normal((concepts, feat_dim)).astype(np.float32)
             for k in ("s", "v", "o")}
    phase = np.sin(np.linspace(0, 3 * np.pi, frames, dtype=np.float32))[:, None]

    def split(n: int, r: np.random.Generator) -> TensorData:
        trip = r.integers(concepts, size=(n, 3))
        feats = (proto["s"][trip[:, 0]][:, None] + proto["v"][trip[:, 1]][:, None] * phase
                 + proto["o"][trip[:, 2]][:, None])
        feats = feats + noise * r.standard_normal(feats.shape).astype(np.float32)
        refs = [[f"a {subj[s]} is {verb[v]} a {obj[o]}", f"the {subj[s]} is {verb[v]} the "
                 f"{obj[o]}"] for s, v, o in trip]
        chosen = [refs[i][int(r.integers(2))] for i in range(n)]
        tgt_in, tgt_out = pad_targets([[stoi[w] for w in c.split()] for c in chosen], 8)
        return TensorData({"src": torch.from_numpy(feats), "tgt_in": tgt_in,
                           "tgt_out": tgt_out, "ref_id": torch.arange(n)},
                          {**meta, "references": refs})

    meta = {"vocab_size": len(itos), "itos": itos, "frames": frames, "feat_dim": feat_dim,
            "tgt_len": 8}
    train = split(n_train, np.random.default_rng(SYNTH_SEED + 1))
    valid = split(n_valid, np.random.default_rng(SYNTH_SEED + 2))
    return DataSplits(train, valid, f"synthetic captioning ({concepts}^3 scenes, {frames} "
                                    f"frames x {feat_dim} features, {n_train} train / "
                                    f"{n_valid} valid clips)")


def _caption_words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def msvd(path: str, frames: int, max_words: int) -> DataSplits:
    root = Path(path)
    feat_dir, cap_file = root / "features", root / "captions.csv"
    if not feat_dir.is_dir() or not cap_file.exists():
        raise WorkloadError(f"{path}: expected MSVD features/<video_id>.npy and captions.csv "
                            "(MSR Video Description Corpus format)")
    captions: dict[str, list[str]] = {}
    with open(cap_file, encoding="utf-8", newline="") as f:
        for row in csv.DictReader(f):
            if row.get("Language", "English") != "English" or not row.get("Description"):
                continue
            vid = f"{row['VideoID']}_{row['Start']}_{row['End']}"
            if (feat_dir / f"{vid}.npy").exists():
                captions.setdefault(vid, []).append(" ".join(_caption_words(row["Description"])))
    if not captions:
        raise WorkloadError(f"{path}: no English caption matches a features/*.npy file")
    ids = list(captions)
    split_file = root / "split.json"
    if split_file.exists():
        spec = json.loads(split_file.read_text())
        train_ids, valid_ids = spec["train"], spec["valid"]
    else:
        n_train = 1200 if len(ids) >= 1300 else max(1, int(len(ids) * 0.8))
        train_ids, valid_ids = ids[:n_train], ids[n_train: n_train + 100]
    vocab = list(dict.fromkeys(w for v in train_ids for c in captions[v] for w in c.split()))
    itos = SPECIALS + vocab
    stoi = {w: i for i, w in enumerate(itos)}
    dim = int(np.load(feat_dir / f"{ids[0]}.npy", mmap_mode="r").shape[1])
    meta = {"vocab_size": len(itos), "itos": itos, "frames": frames, "feat_dim": dim,
            "tgt_len": max_words + 1}

    def clip(vid: str) -> Tensor:
        a = torch.from_numpy(np.load(feat_dir / f"{vid}.npy").astype(np.float32))
        idx = torch.linspace(0, len(a) - 1, frames).round().long() if len(a) > frames else None
        a = a[idx] if idx is not None else a
        out = torch.zeros(frames, dim)
        out[: len(a)] = a
        return out

    def split(vids: list[str], every_caption: bool) -> TensorData:
        pairs = [(i, c) for i, v in enumerate(vids)
                 for c in (captions[v] if every_caption else captions[v][:1])]
        feats = torch.stack([clip(v) for v in vids])
        tgt_in, tgt_out = pad_targets([[stoi.get(w, UNK) for w in c.split()]
                                       for _, c in pairs], max_words + 1)
        vid_index = torch.tensor([i for i, _ in pairs])
        return TensorData({"src": feats[vid_index], "tgt_in": tgt_in, "tgt_out": tgt_out,
                           "ref_id": vid_index}, {**meta, "references": [captions[v]
                                                                         for v in vids]})

    tr, va = split(train_ids, True), split(valid_ids, False)
    return DataSplits(tr, va, f"MSVD {path} ({len(train_ids)} train / {len(valid_ids)} valid "
                              f"clips, vocabulary {len(itos)})")
