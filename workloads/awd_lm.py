"""AWD-LM (Merity et al. 2018, "Regularizing and Optimizing LSTM Language Models").

Layers: ``Embed`` (embedding dropout, which drops whole word vectors, then locked/variational
dropout of the input) -> three ``WeightDropLSTM`` layers (DropConnect on the hidden-to-hidden
matrix, locked dropout on the output; the last layer's hidden size equals the embedding size)
-> ``TiedDecoder`` (the output projection *is* the embedding matrix, plus a bias).

Full scale is the PTB model: 400 embedding, 1150 hidden, 10k vocabulary, 24.2M parameters.

Two deliberate differences from the AWD-LSTM code, both for pipelining:
- the tied weight is one ``nn.Parameter`` registered in two layers; when they land on
  different stages, the pipeline runtime must keep the two copies equal (sum their gradients);
  ``tied_parameters`` finds such groups;
- a minibatch does not carry the LSTM state over from the previous minibatch (truncated BPTT
  with state passing): with several minibatches in flight and round-robin replicas there is
  no single "previous" state. Each window starts from zeros; on the Markov source this costs
  nothing (one token of context suffices).

Weight drop uses ``torch.func.functional_call`` over the stock ``nn.LSTM`` with a dropped
copy of ``weight_hh_l0``: no in-place parameter surgery (that broke on PyTorch >= 1.5).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.func import functional_call

from workloads import data_text
from workloads.base import DataSplits, Layer, LayerModel, ScaleSpec, Tuple, Workload
from workloads.data_text import evaluate_perplexity, lm_loss, markov_target

__all__ = ["AWD_LM", "Embed", "TiedDecoder", "WeightDropLSTM", "build",
           "default_data", "load_data", "locked_dropout", "tied_parameters"]


def locked_dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """One dropout mask per sequence, shared over time. ``x`` is [B, T, C]."""
    if not training or p == 0:
        return x
    mask = x.new_empty(x.shape[0], 1, x.shape[2]).bernoulli_(1 - p) / (1 - p)
    return x * mask


class Embed(Layer):
    def __init__(self, vocab: int, dim: int, dropoute: float, dropouti: float) -> None:
        super().__init__()
        self.encoder = nn.Embedding(vocab, dim)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        self.dropoute, self.dropouti = dropoute, dropouti

    def forward(self, inputs: Tuple) -> Tuple:
        tokens = inputs[0]
        weight = self.encoder.weight
        if self.training and self.dropoute > 0:
            keep = weight.new_empty(weight.shape[0], 1).bernoulli_(1 - self.dropoute)
            weight = weight * keep / (1 - self.dropoute)
        x = nn.functional.embedding(tokens, weight)
        return (locked_dropout(x, self.dropouti, self.training),)


class WeightDropLSTM(Layer):
    def __init__(self, n_in: int, n_hidden: int, weight_drop: float, dropout_out: float) -> None:
        super().__init__()
        self.lstm = nn.LSTM(n_in, n_hidden, batch_first=True)
        self.weight_drop, self.dropout_out = weight_drop, dropout_out

    def forward(self, inputs: Tuple) -> Tuple:
        x = inputs[0]
        if self.training and self.weight_drop > 0:
            params = dict(self.lstm.named_parameters())
            params["weight_hh_l0"] = nn.functional.dropout(params["weight_hh_l0"],
                                                           self.weight_drop, True)
            y, _ = functional_call(self.lstm, params, (x,))
        else:
            y, _ = self.lstm(x)
        return (locked_dropout(y, self.dropout_out, self.training),)


class TiedDecoder(Layer):
    def __init__(self, embed: Embed, dropout: float) -> None:
        super().__init__()
        self.weight = embed.encoder.weight  # the same Parameter: tied
        self.bias = nn.Parameter(torch.zeros(self.weight.shape[0]))
        self.dropout = dropout

    def forward(self, inputs: Tuple) -> Tuple:
        x = locked_dropout(inputs[0], self.dropout, self.training)
        return (nn.functional.linear(x, self.weight, self.bias),)


def build(scale: str, meta: dict) -> LayerModel:
    cfg = AWD_LM.spec(scale).model
    vocab = int(meta.get("vocab_size", cfg["vocab"]))
    emb, hid = cfg["emb"], cfg["hidden"]
    torch.manual_seed(int(meta.get("init_seed", 0)))
    embed = Embed(vocab, emb, cfg["dropoute"], cfg["dropouti"])
    sizes = [emb, hid, hid, emb]
    lstms = [WeightDropLSTM(sizes[i], sizes[i + 1], cfg["wdrop"],
                            cfg["dropouth"] if i < 2 else cfg["dropout"]) for i in range(3)]
    return LayerModel([embed, *lstms, TiedDecoder(embed, 0.0)])


def tied_parameters(model: nn.Module) -> list[list[str]]:
    """Groups of qualified parameter names that are one tensor (e.g. AWD-LM's embedding)."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def default_data(scale: str, seed: int) -> DataSplits:
    """The Markov source of ``data_text.SOURCES`` (shared with GPT), in bptt windows; the
    corpus is fixed, so ``seed`` is unused."""
    return data_text.markov_default(scale, AWD_LM.spec(scale).model["bptt"])


def load_data(path: str, scale: str) -> DataSplits:
    return data_text.ptb(path, AWD_LM.spec(scale).model["bptt"])


_DROP = {"dropoute": 0.0, "dropouti": 0.0, "dropouth": 0.0, "dropout": 0.0, "wdrop": 0.0}
AWD_LM = Workload(
    name="awd-lm",
    description="AWD-LSTM language model, 3 weight-dropped LSTMs, tied embeddings",
    metric="perplexity", higher_is_better=False,
    scales={
        "tiny": ScaleSpec({"vocab": 64, "emb": 32, "hidden": 64, "bptt": 35, **_DROP,
                           "wdrop": 0.1}, 32, 1e-2, markov_target("tiny", 1.2),
                          optimizer="adam", grad_clip=0.25, epochs=40),
        "small": ScaleSpec({"vocab": 1000, "emb": 200, "hidden": 400, "bptt": 35, **_DROP,
                            "wdrop": 0.2, "dropouth": 0.1}, 32, 3e-3, markov_target("small", 1.2),
                           optimizer="adam", grad_clip=0.25, epochs=40),
        # Merity et al.'s PTB hyper-parameters (SGD lr 30, clip 0.25, batch 80, bptt 70); the
        # real-data target is their PTB validation perplexity without fine-tuning (60.0).
        "full": ScaleSpec({"vocab": 10000, "emb": 400, "hidden": 1150, "bptt": 70,
                           "dropoute": 0.1, "dropouti": 0.65, "dropouth": 0.3, "dropout": 0.4,
                           "wdrop": 0.5}, 80, 30.0, markov_target("full", 1.2),
                          optimizer="sgd-plain", weight_decay=1.2e-6, grad_clip=0.25,
                          real_target=60.0, epochs=500),
    },
    build=build, loss=lm_loss, make_batch=data_text.lm_batch, evaluate=evaluate_perplexity,
    default_data=default_data, load_data=load_data,
    default_data_name="Markov source with known entropy rate (no download)",
    real_data_name="PTB text files (ptb.train.txt, ptb.valid.txt)",
    published_parameters=24_221_600,
    static_shapes=True,  # fixed windows of bptt tokens (data_text.windows)
)
