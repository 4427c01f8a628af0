"""workloads/metrics.py, the language-model perplexity (data_text.evaluate_perplexity) and the
Markov source's entropy rate, against known values."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workloads import metrics
from workloads.base import Layer, LayerModel
from workloads.data_text import MarkovSource, evaluate_perplexity, windows


def test_bleu_of_identical_and_disjoint_sentences() -> None:
    refs = ["the cat sat on the mat", "a b c d e f"]
    assert metrics.bleu(refs, refs) == pytest.approx(100.0)
    assert metrics.bleu(["x y z w v u", "q r s t u v"], refs) == pytest.approx(0.0)


def test_top1() -> None:
    logits = torch.tensor([[0.1, 0.9], [0.8, 0.2], [0.3, 0.7]])
    assert metrics.top1(logits, torch.tensor([1, 1, 1])) == pytest.approx(2 / 3)


class Uniform(Layer):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.vocab = vocab
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    def forward(self, inputs: tuple) -> tuple:
        x = inputs[0]
        return (torch.zeros(*x.shape, self.vocab) + 0 * self.dummy,)


def test_perplexity_of_a_uniform_model_is_the_vocabulary_size() -> None:
    vocab = 37
    data = windows(torch.randint(0, vocab, (1000,)), 10, {})
    ppl = evaluate_perplexity(LayerModel([Uniform(vocab)]), data, 16)
    assert ppl == pytest.approx(vocab, rel=1e-5)  # float32 sums
    assert metrics.perplexity(5 * math.log(7), 5) == pytest.approx(7)


def test_markov_entropy_rate_matches_the_empirical_log_loss() -> None:
    src = MarkovSource(vocab_size=20, branching=5, alpha=0.5, seed=3)
    p = src.transition()
    assert np.allclose(p.sum(1), 1.0)
    pi = src.stationary
    assert np.allclose(pi @ p, pi, atol=1e-9)
    seq = src.sample(200_000, seed=4)
    empirical = -np.mean(np.log(p[seq[:-1], seq[1:]]))
    assert empirical == pytest.approx(src.entropy_rate(), rel=0.02)


def test_meteor_identical_beats_disjoint() -> None:
    refs = [["a man is playing a guitar"], ["a woman is slicing a tomato"]]
    same = metrics.meteor(["a man is playing a guitar", "a woman is slicing a tomato"], refs)
    other = metrics.meteor(["blue sky", "green grass"], refs)
    assert same > 0.9 and other < 0.05
