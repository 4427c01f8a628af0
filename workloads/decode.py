"""Greedy decoding and the text metrics of the sequence-to-sequence workloads.

Decoding uses only the layer list: at step t the whole model runs on the prefix
``[BOS, y_1 .. y_t]`` and the arg-max at position t is appended. That recomputes the encoder
and the prefix every step (O(T^2)) but needs no incremental-state API in the layers, so any
system's trained layers decode the same way. Teacher forcing is used for training only.
"""

from __future__ import annotations

import torch
from torch import Tensor

from workloads.base import Dataset, LayerModel
from workloads.data_seq2seq import BOS, PAD, strip_tokens
from workloads.metrics import bleu, meteor

__all__ = ["decode_split", "evaluate_bleu", "evaluate_meteor", "greedy"]


@torch.no_grad()
def greedy(model: LayerModel, src: Tensor, tgt_len: int) -> Tensor:
    """[B, tgt_len] token ids decoded from ``src``."""
    batch = src.shape[0]
    ys = torch.full((batch, tgt_len), PAD, dtype=torch.int64, device=src.device)
    ys[:, 0] = BOS
    out = torch.full((batch, tgt_len), PAD, dtype=torch.int64, device=src.device)
    for t in range(tgt_len):
        logits = model((src, ys))[0]
        nxt = logits[:, t].argmax(-1)
        out[:, t] = nxt
        if t + 1 < tgt_len:
            ys[:, t + 1] = nxt
    return out


def _to_text(ids: list[int], itos: list[str] | None, bpe: bool) -> str:
    toks = [itos[i] if itos else str(i) for i in strip_tokens(ids)]
    text = " ".join(toks)
    return text.replace("@@ ", "") if bpe else text


def decode_split(model: LayerModel, data: Dataset, batch_size: int) -> list[str]:
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    itos, bpe = data.meta.get("itos"), bool(data.meta.get("bpe"))
    tgt_len = int(data.meta["tgt_len"])
    hyps: list[str] = []
    for start in range(0, len(data), batch_size):
        d = data.take(torch.arange(start, min(start + batch_size, len(data))))
        pred = greedy(model, d["src"].to(device), tgt_len).cpu().tolist()
        hyps += [_to_text(p, itos, bpe) for p in pred]
    model.train(was_training)
    return hyps


def evaluate_bleu(model: LayerModel, data: Dataset, batch_size: int) -> float:
    hyps = decode_split(model, data, batch_size)
    itos, bpe = data.meta.get("itos"), bool(data.meta.get("bpe"))
    refs = [_to_text(r, itos, bpe) for r in data.take(torch.arange(len(data)))["tgt_out"].tolist()]
    return bleu(hyps, refs)


def evaluate_meteor(model: LayerModel, data: Dataset, batch_size: int) -> float:
    hyps = decode_split(model, data, batch_size)
    ref_ids = data.take(torch.arange(len(data)))["ref_id"].tolist()
    return meteor(hyps, [data.meta["references"][i] for i in ref_ids])
