"""Language-model data (a Markov source with a known entropy rate, and PTB from disk), and
what every language-model workload (AWD-LM, GPT) reads its windows with: the batch, the
loss and the validation perplexity, one home for the three.

Default data: a fixed first-order Markov chain over V tokens: each token has ``branching``
random successors with probabilities drawn from a Dirichlet(alpha) distribution (seeded,
independent of the training seed). Its entropy rate H = sum_i pi_i * H(P_i) (pi the
stationary distribution) is the best reachable cross-entropy, so exp(H) is the best
reachable perplexity and a target such as 1.2 x exp(H)
means "learned the source", not "memorised the corpus".

A stream of tokens is cut into windows of ``bptt`` tokens: a sample is (x = w[0:T],
y = w[1:T+1]). Windows do not carry hidden state across minibatches (see awd_lm.py). A
window has no padding, so the loss (``lm_loss``) and the perplexity
(``evaluate_perplexity``) count every target token.

Real data: Penn Treebank as distributed with Mikolov's RNNLM toolkit / AWD-LSTM's
``getdata.sh``: ``ptb.train.txt``, ``ptb.valid.txt`` (and ``ptb.test.txt``), one sentence
per line, words separated by spaces, ``<unk>`` for rare words; each line ends with ``<eos>``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import torch
from torch import Tensor, nn

from core.errors import WorkloadError
from workloads.base import (
    Batch,
    Dataset,
    DataSplits,
    LayerModel,
    TensorData,
    Tuple,
    cross_entropy_tokens,
)
from workloads.metrics import perplexity

__all__ = ["CORPUS", "MARKOV_SEED", "SOURCES", "MarkovSource", "evaluate_perplexity",
           "lm_batch", "lm_loss", "markov", "markov_default", "markov_target", "ptb",
           "read_ptb_tokens", "windows"]

MARKOV_SEED = 1150


@dataclass(frozen=True)
class MarkovSource:
    """Token i is followed by one of ``branching`` successors (a fixed random subset) with
    Dirichlet(alpha) probabilities: sparse, so a 10k vocabulary stays cheap."""

    vocab_size: int
    branching: int
    alpha: float
    seed: int = MARKOV_SEED

    @cached_property
    def _chain(self) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(self.seed)
        k = min(self.branching, self.vocab_size)
        succ = np.stack([rng.choice(self.vocab_size, size=k, replace=False)
                         for _ in range(self.vocab_size)])
        prob = rng.dirichlet(np.full(k, self.alpha), size=self.vocab_size)
        return succ, prob

    def transition(self) -> np.ndarray:
        """Dense V x V matrix (for tests on small vocabularies)."""
        succ, prob = self._chain
        p = np.zeros((self.vocab_size, self.vocab_size))
        np.put_along_axis(p, succ, prob, axis=1)
        return p

    @cached_property
    def stationary(self) -> np.ndarray:
        succ, prob = self._chain
        pi = np.full(self.vocab_size, 1.0 / self.vocab_size)
        for _ in range(10_000):
            nxt = np.bincount(succ.ravel(), weights=(pi[:, None] * prob).ravel(),
                              minlength=self.vocab_size)
            done = np.abs(nxt - pi).sum() < 1e-12
            pi = nxt
            if done:
                break
        return pi / pi.sum()

    def entropy_rate(self) -> float:
        """Nats per token: sum_i pi_i * H(P_i)."""
        _, prob = self._chain
        with np.errstate(divide="ignore", invalid="ignore"):
            row_h = -np.where(prob > 0, prob * np.log(prob), 0.0).sum(axis=1)
        return float(self.stationary @ row_h)

    def best_perplexity(self) -> float:
        return math.exp(self.entropy_rate())

    def sample(self, n_tokens: int, seed: int) -> np.ndarray:
        succ, prob = self._chain
        cdf = np.cumsum(prob, axis=1)
        cdf[:, -1] = 1.0
        rng = np.random.default_rng(seed)
        u = rng.random(n_tokens)
        out = np.empty(n_tokens, dtype=np.int64)
        state = int(rng.integers(self.vocab_size))
        for i in range(n_tokens):
            state = int(succ[state, np.searchsorted(cdf[state], u[i], side="right")])
            out[i] = state
        return out


def windows(stream: Tensor, bptt: int, meta: dict) -> TensorData:
    n = (len(stream) - 1) // bptt
    if n < 1:
        raise WorkloadError(f"text of {len(stream)} tokens is shorter than one window of {bptt}")
    x = stream[: n * bptt].view(n, bptt)
    y = stream[1: n * bptt + 1].view(n, bptt)
    return TensorData({"x": x, "y": y}, meta)


def lm_batch(data: Dataset, index: Tensor, targets_only: bool = False) -> Batch:
    if targets_only:
        return Batch((), data.take(index, ("y",))["y"])
    d = data.take(index)
    return Batch((d["x"],), d["y"])


def lm_loss(outputs: Tuple, targets: Tensor) -> Tensor:
    """Mean token cross-entropy of logits ``outputs[0]`` [B, T, V] (no token is padding)."""
    return cross_entropy_tokens(outputs, targets, pad=-100)


@torch.no_grad()
def evaluate_perplexity(model: LayerModel, data: Dataset, batch_size: int) -> float:
    """Perplexity of ``model`` over every window of ``data``, ``batch_size`` windows at a
    time, in eval mode (the model's mode is restored)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    nll, tokens = 0.0, 0
    for start in range(0, len(data), batch_size):
        b = lm_batch(data, torch.arange(start, min(start + batch_size, len(data))))
        b = b.to(device)
        logits = model(b.inputs)[0]
        nll += float(nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                 b.targets.reshape(-1), reduction="sum"))
        tokens += b.targets.numel()
    model.train(was_training)
    return perplexity(nll, tokens)


def markov(source: MarkovSource, train_tokens: int, valid_tokens: int, bptt: int,
           seed: int) -> DataSplits:
    """``seed`` is unused: the corpus is fixed so every run sees the same text."""
    train = torch.from_numpy(source.sample(train_tokens, source.seed + 1))
    valid = torch.from_numpy(source.sample(valid_tokens, source.seed + 2))
    meta = {"vocab_size": source.vocab_size, "best_perplexity": source.best_perplexity()}
    return DataSplits(windows(train, bptt, meta), windows(valid, bptt, meta),
                      f"Markov source V={source.vocab_size}, {source.branching} successors, "
                      f"(best perplexity {source.best_perplexity():.3f}), "
                      f"{train_tokens} train / {valid_tokens} valid tokens")


# the default data of the language-model workloads (AWD-LM, GPT), per scale: the source
# and the training / validation token counts
SOURCES = {"tiny": MarkovSource(64, 8, 0.5), "small": MarkovSource(1000, 16, 0.5),
           "full": MarkovSource(10000, 32, 0.5)}
CORPUS = {"tiny": (60_000, 10_000), "small": (400_000, 40_000), "full": (1_000_000, 80_000)}


def markov_default(scale: str, window: int) -> DataSplits:
    """The scale's default data: its source's corpus cut into windows of ``window``."""
    train, valid = CORPUS[scale]
    return markov(SOURCES[scale], train, valid, window, 0)


def markov_target(scale: str, factor: float) -> float:
    """A target on the scale's default data: ``factor`` x its best reachable perplexity."""
    return round(SOURCES[scale].best_perplexity() * factor, 2)


def read_ptb_tokens(file: Path) -> list[str]:
    words: list[str] = []
    with open(file, encoding="utf-8") as f:
        for line in f:
            words += line.split() + ["<eos>"]
    return words


def ptb(path: str, bptt: int) -> DataSplits:
    root = Path(path)
    train_f, valid_f = root / "ptb.train.txt", root / "ptb.valid.txt"
    if not train_f.exists() or not valid_f.exists():
        raise WorkloadError(f"{path}: expected PTB files ptb.train.txt and ptb.valid.txt")
    train_w = read_ptb_tokens(train_f)
    vocab = {w: i for i, w in enumerate(dict.fromkeys(train_w))}
    valid_w = read_ptb_tokens(valid_f)
    unknown = sorted({w for w in valid_w if w not in vocab})
    if unknown:
        if "<unk>" not in vocab:
            raise WorkloadError(f"{path}: validation words {unknown[:3]} are not in the "
                                "training vocabulary and there is no <unk> token")
        valid_w = [w if w in vocab else "<unk>" for w in valid_w]
    meta = {"vocab_size": len(vocab), "vocab": list(vocab)}

    def encode(ws: list[str]) -> Tensor:
        return torch.tensor([vocab[w] for w in ws], dtype=torch.int64)

    return DataSplits(windows(encode(train_w), bptt, meta), windows(encode(valid_w), bptt, meta),
                      f"PTB {path} ({len(train_w)} train / {len(valid_w)} valid tokens, "
                      f"vocabulary {len(vocab)})")
