"""S2VT (Venugopalan et al. 2015, "Sequence to Sequence -- Video to Text") as a layer list.

Two stacked LSTMs read the clip's frame features, then write the caption: during the F
encoding steps the first LSTM reads the (projected) frame features and the second reads
[h1; <pad word>]; during the T decoding steps the first LSTM reads padding and the second
reads [h1; previous word embedding]. Only decoding steps are scored. Full scale is the
paper's: 4096-dim VGG fc7 frame features projected to 500, two LSTMs of 1000 units, 500-dim
word embeddings, 80 frames. The paper publishes no parameter count; ``parameter_formula``
gives the exact count the tests check.

Tuple between layers: ``(frames_or_h1, tgt_in)`` and finally ``(logits,)``.
"""

from __future__ import annotations

import torch
from torch import nn

from workloads import data_seq2seq
from workloads.base import DataSplits, Layer, LayerModel, ScaleSpec, Tuple, Workload
from workloads.decode import evaluate_meteor
from workloads.gnmt import seq_loss

__all__ = ["FrameProjection", "LanguageLSTM", "S2VT", "VisualLSTM", "WordClassifier", "build",
           "default_data", "load_data", "parameter_formula"]


class FrameProjection(Layer):
    def __init__(self, feat_dim: int, emb: int, dropout: float) -> None:
        super().__init__()
        self.proj = nn.Linear(feat_dim, emb)
        self.drop = nn.Dropout(dropout)

    def forward(self, inputs: Tuple) -> Tuple:
        frames, tgt_in = inputs
        return self.drop(self.proj(frames)), tgt_in


class VisualLSTM(Layer):
    """LSTM 1 over F frame steps followed by T padding steps."""

    def __init__(self, emb: int, hidden: int) -> None:
        super().__init__()
        self.lstm = nn.LSTM(emb, hidden, batch_first=True)

    def forward(self, inputs: Tuple) -> Tuple:
        x, tgt_in = inputs
        pad = x.new_zeros(x.shape[0], tgt_in.shape[1], x.shape[2])
        h, _ = self.lstm(torch.cat([x, pad], dim=1))
        return h, tgt_in


class LanguageLSTM(Layer):
    """LSTM 2 over [h1; word]; returns the T decoding steps only."""

    def __init__(self, vocab: int, emb: int, hidden: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, emb, padding_idx=data_seq2seq.PAD)
        self.lstm = nn.LSTM(hidden + emb, hidden, batch_first=True)

    def forward(self, inputs: Tuple) -> Tuple:
        h1, tgt_in = inputs
        steps = tgt_in.shape[1]
        words = self.embed(tgt_in)
        words = torch.cat([words.new_zeros(words.shape[0], h1.shape[1] - steps,
                                           words.shape[2]), words], dim=1)
        h2, _ = self.lstm(torch.cat([h1, words], dim=-1))
        return (h2[:, -steps:],)


class WordClassifier(Layer):
    def __init__(self, hidden: int, vocab: int) -> None:
        super().__init__()
        self.out = nn.Linear(hidden, vocab)

    def forward(self, inputs: Tuple) -> Tuple:
        return (self.out(inputs[0]),)


def build(scale: str, meta: dict) -> LayerModel:
    cfg = S2VT.spec(scale).model
    vocab = int(meta.get("vocab_size", cfg["vocab"]))
    feat = int(meta.get("feat_dim", cfg["feat_dim"]))
    torch.manual_seed(int(meta.get("init_seed", 0)))
    emb, hid = cfg["emb"], cfg["hidden"]
    return LayerModel([FrameProjection(feat, emb, cfg["dropout"]), VisualLSTM(emb, hid),
                       LanguageLSTM(vocab, emb, hid), WordClassifier(hid, vocab)])


def parameter_formula(vocab: int, feat: int, emb: int, hidden: int) -> int:
    def lstm(n_in: int, n_h: int) -> int:
        return 4 * (n_in * n_h + n_h * n_h + 2 * n_h)
    return (feat * emb + emb) + lstm(emb, hidden) + vocab * emb + lstm(hidden + emb, hidden) \
        + hidden * vocab + vocab


_DATA = {"tiny": (6, 12, 64, 2000), "small": (12, 20, 512, 6000), "full": (30, 80, 4096, 12000)}


def default_data(scale: str, seed: int) -> DataSplits:
    concepts, frames, feat, n = _DATA[scale]
    return data_seq2seq.synthetic_captions(concepts, frames, feat, n, 200, noise=1.0, seed=seed)


def load_data(path: str, scale: str) -> DataSplits:
    return data_seq2seq.msvd(path, frames=S2VT.spec(scale).model["frames"], max_words=20)


S2VT = Workload(
    name="s2vt", description="S2VT video captioning: two stacked LSTMs, encode then decode",
    metric="meteor", higher_is_better=True,
    scales={
        "tiny": ScaleSpec({"vocab": 25, "feat_dim": 64, "emb": 32, "hidden": 64, "frames": 12,
                           "dropout": 0.0}, 32, 3e-3, 0.8, optimizer="adam", grad_clip=5.0),
        "small": ScaleSpec({"vocab": 43, "feat_dim": 512, "emb": 128, "hidden": 256,
                            "frames": 20, "dropout": 0.2}, 32, 2e-3, 0.8, optimizer="adam",
                           grad_clip=5.0),
        # The paper reports METEOR 29.2 (0.292) on MSVD; PipeDream quotes 0.294.
        "full": ScaleSpec({"vocab": 12000, "feat_dim": 4096, "emb": 500, "hidden": 1000,
                           "frames": 80, "dropout": 0.5}, 32, 1e-4, 0.8, optimizer="adam",
                          grad_clip=5.0, real_target=0.294),
    },
    build=build, loss=seq_loss, make_batch=data_seq2seq.seq2seq_batch, evaluate=evaluate_meteor,
    default_data=default_data, load_data=load_data,
    static_shapes=True,  # clips of a fixed frame count, captions padded (data_seq2seq)
    default_data_name="synthetic subject-verb-object clips (no download)",
    real_data_name="MSVD frame features (.npy) + captions.csv",
    published_parameters=None,
)
