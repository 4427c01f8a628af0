"""GNMT-8 and GNMT-16 (Wu et al. 2016; the MLPerf reference's layout) as layer lists.

Encoder: embedding; layer 1 a bidirectional LSTM; layer 2 an LSTM over its 2H outputs;
layers 3.. LSTMs with residual connections. Decoder: embedding; layer 1 an LSTM followed by
Bahdanau attention over the encoder outputs (padding masked); every further layer
an LSTM over [h; context], residual from the third layer on; a linear classifier over the
shared 32k vocabulary. GNMT-8 is 4 + 4 layers (MLPerf), GNMT-16 is 8 + 8.

Encoder and decoder each have their own embedding over the shared vocabulary, as in the MLPerf
model PipeDream profiled (its gnmt profile sums to 193,765,952 parameters, which this model
matches at scale ``full``).

The tuple that flows between layers: encoder layers carry ``(x, src, tgt_in)``; decoder
layers carry ``(enc_out, src, h, context)``. ``src`` (token ids) rides along so the attention
can mask padding and the bidirectional layer can pack by length.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from workloads import data_seq2seq
from workloads.base import (
    DataSplits,
    Layer,
    LayerModel,
    ScaleSpec,
    Tuple,
    Workload,
    cross_entropy_tokens,
)
from workloads.decode import evaluate_bleu

__all__ = ["BahdanauAttention", "Classifier", "DecoderEmbed", "DecoderLSTM", "EncoderBiLSTM",
           "EncoderLSTM", "GNMT16", "GNMT8", "RecurrentAttention", "SrcEmbed", "build_layers",
           "seq_loss"]


class SrcEmbed(Layer):
    def __init__(self, vocab: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=data_seq2seq.PAD)
        self.drop = nn.Dropout(dropout)

    def forward(self, inputs: Tuple) -> Tuple:
        src, tgt_in = inputs
        return self.drop(self.embed(src)), src, tgt_in


class EncoderBiLSTM(Layer):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True, bidirectional=True)

    def forward(self, inputs: Tuple) -> Tuple:
        x, src, tgt_in = inputs
        lengths = (src != data_seq2seq.PAD).sum(1).clamp(min=1).cpu()
        packed = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, _ = self.lstm(packed)
        y, _ = pad_packed_sequence(y, batch_first=True, total_length=x.shape[1])
        return y, src, tgt_in


class EncoderLSTM(Layer):
    def __init__(self, n_in: int, hidden: int, residual: bool, dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_in, hidden, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.residual = residual

    def forward(self, inputs: Tuple) -> Tuple:
        x, src, tgt_in = inputs
        y, _ = self.lstm(self.drop(x))
        return (y + x if self.residual else y), src, tgt_in


class BahdanauAttention(nn.Module):
    """Bahdanau attention v . tanh(W_q q + W_k k), as in the GNMT PipeDream profiled
    (``normalize=False`` in the MLPerf code: no normalisation scalar and bias)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear_q = nn.Linear(hidden, hidden, bias=False)
        self.linear_k = nn.Linear(hidden, hidden, bias=False)
        self.linear_att = nn.Parameter(torch.empty(hidden).uniform_(-0.1, 0.1))

    def forward(self, query: Tensor, keys: Tensor, pad_mask: Tensor) -> Tensor:
        q = self.linear_q(query).unsqueeze(2)  # [B, T, 1, H]
        k = self.linear_k(keys).unsqueeze(1)  # [B, 1, S, H]
        scores = torch.tanh(q + k) @ self.linear_att  # [B, T, S]
        scores = scores.masked_fill(pad_mask.unsqueeze(1), float("-inf"))
        return torch.softmax(scores, dim=-1) @ keys  # [B, T, H]


class DecoderEmbed(Layer):
    def __init__(self, vocab: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden, padding_idx=data_seq2seq.PAD)
        self.drop = nn.Dropout(dropout)

    def forward(self, inputs: Tuple) -> Tuple:
        enc, src, tgt_in = inputs
        return enc, src, self.drop(self.embed(tgt_in))


class RecurrentAttention(Layer):
    """Decoder layer 1: LSTM over the target embeddings, then attention -> (h, context)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(hidden, hidden, batch_first=True)
        self.attn = BahdanauAttention(hidden)

    def forward(self, inputs: Tuple) -> Tuple:
        enc, src, y = inputs
        h, _ = self.lstm(y)
        ctx = self.attn(h, enc, src == data_seq2seq.PAD)
        return enc, src, h, ctx


class DecoderLSTM(Layer):
    def __init__(self, hidden: int, residual: bool, dropout: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(2 * hidden, hidden, batch_first=True)
        self.drop = nn.Dropout(dropout)
        self.residual = residual

    def forward(self, inputs: Tuple) -> Tuple:
        enc, src, h, ctx = inputs
        y, _ = self.lstm(torch.cat([self.drop(h), ctx], dim=-1))
        return enc, src, (y + h if self.residual else y), ctx


class Classifier(Layer):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.classifier = nn.Linear(hidden, vocab)

    def forward(self, inputs: Tuple) -> Tuple:
        return (self.classifier(inputs[2]),)


def build_layers(vocab: int, hidden: int, depth: int, dropout: float) -> list[Layer]:
    """``depth`` LSTM layers in the encoder and ``depth`` in the decoder."""
    enc: list[Layer] = [SrcEmbed(vocab, hidden, dropout), EncoderBiLSTM(hidden),
                        EncoderLSTM(2 * hidden, hidden, residual=False, dropout=dropout)]
    enc += [EncoderLSTM(hidden, hidden, residual=True, dropout=dropout)
            for _ in range(depth - 2)]
    dec: list[Layer] = [DecoderEmbed(vocab, hidden, dropout), RecurrentAttention(hidden),
                        DecoderLSTM(hidden, residual=False, dropout=dropout)]
    dec += [DecoderLSTM(hidden, residual=True, dropout=dropout) for _ in range(depth - 2)]
    return enc + dec + [Classifier(hidden, vocab)]


def _init(model: nn.Module) -> None:
    # MLPerf GNMT initialises every LSTM/linear/embedding weight uniformly in [-0.1, 0.1].
    for p in model.parameters():
        nn.init.uniform_(p, -0.1, 0.1)


def _make(depth: int):
    def build(scale: str, meta: dict) -> LayerModel:
        wl = GNMT8 if depth == 4 else GNMT16
        cfg = wl.spec(scale).model
        torch.manual_seed(int(meta.get("init_seed", 0)))
        model = LayerModel(build_layers(int(meta.get("vocab_size", cfg["vocab"])),
                                        cfg["hidden"], depth, cfg["dropout"]))
        _init(model)
        return model
    return build


def seq_loss(outputs: Tuple, targets: Tensor) -> Tensor:
    return cross_entropy_tokens(outputs, targets, pad=data_seq2seq.PAD)


def _default_data(scale: str, seed: int) -> DataSplits:
    words, n_train, max_len = {"tiny": (24, 4000, 10), "small": (500, 20000, 20),
                               "full": (16158, 100000, 50)}[scale]
    return data_seq2seq.synthetic_translation(words, n_train, 256, 4, max_len, seed)


def _real_data(path: str, scale: str) -> DataSplits:
    return data_seq2seq.wmt16(path, max_len=50)


def _workload(name: str, depth: int, published: int) -> Workload:
    return Workload(
        name=name,
        description=f"GNMT-{2 * depth}: {depth}+{depth} LSTM layers with attention",
        metric="bleu", higher_is_better=True,
        scales={
            "tiny": ScaleSpec({"vocab": 52, "hidden": 64, "dropout": 0.0}, 32, 5e-3, 90.0,
                              optimizer="adam", grad_clip=5.0),
            "small": ScaleSpec({"vocab": 1004, "hidden": 256, "dropout": 0.1}, 64, 2e-3, 90.0,
                               optimizer="adam", grad_clip=5.0),
            # MLPerf GNMT: Adam lr 2e-3, batch 128 per GPU, target BLEU 24.0 on newstest2014.
            "full": ScaleSpec({"vocab": 32320, "hidden": 1024, "dropout": 0.2}, 128, 2e-3,
                              90.0, optimizer="adam", grad_clip=5.0, real_target=24.0,
                              epochs=6),
        },
        build=_make(depth), loss=seq_loss, make_batch=data_seq2seq.seq2seq_batch,
        evaluate=evaluate_bleu, default_data=_default_data, load_data=_real_data,
        default_data_name="synthetic dictionary+reordering translation (no download)",
        real_data_name="WMT16 EN-DE tokenized BPE text pairs",
        published_parameters=published,
        static_shapes=True)  # sentences padded to the dataset's lengths (data_seq2seq)


GNMT8 = _workload("gnmt8", 4, published=193_765_952)
GNMT16 = _workload("gnmt16", 8, published=277_717_568)
