"""GPT: the decoder-only transformer that today's pipeline schedules are compared on.

Why it is here: Megatron-LM, DeepSpeed, torchtitan and the zero-bubble and DualPipe papers
report on GPT/Llama-style models, where activation memory, a tied embedding and uneven
first and last stages decide which schedule wins; PipeDream's six workloads (2019) cannot
ask that question.

Layers (every one a tuple-in, tuple-out ``Layer``, so any contiguous range is a stage):
``Embed`` -> N pre-norm ``Block`` (x + attention(norm(x)), then x + MLP(norm(x))) ->
``Head`` (final norm, then the vocabulary projection). Attention is causal and runs through
torch's own ``scaled_dot_product_attention``. Two variants, two workloads:

- ``gpt`` (GPT-2 style): learned positions, LayerNorm, GELU MLP (4x), the head's matrix
  *is* the token embedding (one ``nn.Parameter`` registered in both layers, as AWD-LM's
  decoder; on different stages the runtime's ties keep the two copies equal). Full scale
  is GPT-2 124M (12 layers, width 768, 12 heads, 1024 positions, 50,257 tokens).
- ``gpt-llama`` (Llama style): rotary position embedding on queries and keys, RMSNorm,
  SwiGLU MLP, no biases, an untied head, so engines that cannot tie weights across
  stages (the torch peers, DeepSpeed) run it too. Full scale is a ~1B configuration
  (16 layers, width 2048, 32 heads, SwiGLU 5632, 32,000 tokens, 2048 positions).

Data and metric: AWD-LM's Markov token stream by default (``data_text.markov_default``),
or nanoGPT's ``train.bin``/``val.bin`` or UTF-8 text (``workloads.data_tokens``);
validation perplexity, evaluated in batches of a bounded number of logits (``evaluate``).
The target on the default data is 1.2 x the source's best reachable perplexity at every
scale (as AWD-LM's); on real data the full scale's is nanoGPT's GPT-2 124M validation
loss on OpenWebText, meaningful for GPT-2 token files only: give ``--target`` for other
data.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn
from torch.nn import functional as F  # noqa: N812 - torch's own convention

from workloads import data_tokens
from workloads.base import Dataset, Layer, LayerModel, ScaleSpec, Tuple, Workload
from workloads.data_text import (
    SOURCES,
    evaluate_perplexity,
    lm_batch,
    lm_loss,
    markov_default,
    markov_target,
)

__all__ = ["EVAL_LOGITS", "GPT", "GPT_LLAMA", "Block", "Embed", "Head", "build_variant",
           "evaluate", "parameter_formula", "rope"]

STD = 0.02  # GPT-2's initialisation of every matrix
RMS_EPS = 1e-5  # Llama's RMSNorm epsilon
EVAL_LOGITS = 1 << 26  # logits per evaluation batch: 256 MB in float32


class Embed(Layer):
    """Token ids [B, T] -> hidden states [B, T, C] (plus learned positions, GPT-2)."""

    def __init__(self, vocab: int, width: int, positions: int, learned_positions: bool,
                 dropout: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        nn.init.normal_(self.tokens.weight, std=STD)
        self.positions = nn.Embedding(positions, width) if learned_positions else None
        if self.positions is not None:
            nn.init.normal_(self.positions.weight, std=STD / 2)
        self.dropout = nn.Dropout(dropout)

    def forward(self, inputs: Tuple) -> Tuple:
        x = self.tokens(inputs[0])
        if self.positions is not None:
            x = x + self.positions(torch.arange(x.shape[1], device=x.device))
        return (self.dropout(x),)


def rope(x: Tensor, base: float = 10000.0) -> Tensor:
    """Rotary position embedding of ``x`` [B, H, T, D] (D even): channel pairs (i, i + D/2)
    rotated by position t times base^(-2i/D) (the GPT-NeoX / Llama layout)."""
    _, _, t, d = x.shape
    inv = base ** (-torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d)
    angles = torch.outer(torch.arange(t, device=x.device, dtype=torch.float32), inv)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    a, b = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)


def _norm(width: int, llama: bool) -> nn.Module:
    return nn.RMSNorm(width, eps=RMS_EPS) if llama else nn.LayerNorm(width)


class Block(Layer):
    """One pre-norm transformer block: causal self-attention, then the MLP, each added to
    the residual stream."""

    def __init__(self, width: int, heads: int, hidden: int, llama: bool, dropout: float,
                 layers: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = _norm(width, llama), _norm(width, llama)
        self.heads, self.llama, self.dropout = heads, llama, dropout
        self.qkv = nn.Linear(width, 3 * width, bias=not llama)
        self.proj = nn.Linear(width, width, bias=not llama)
        if llama:  # SwiGLU: down(silu(gate(x)) * up(x))
            self.up = nn.Linear(width, 2 * hidden, bias=False)
        else:
            self.up = nn.Linear(width, hidden)
        self.down = nn.Linear(hidden, width, bias=not llama)
        for lin in (self.qkv, self.proj, self.up, self.down):
            nn.init.normal_(lin.weight, std=STD)
            if lin.bias is not None:
                nn.init.zeros_(lin.bias)
        for lin in (self.proj, self.down):  # GPT-2's scaled residual projections
            nn.init.normal_(lin.weight, std=STD / math.sqrt(2 * layers))
        self.drop = nn.Dropout(dropout)

    def attention(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))
        if self.llama:
            q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.drop(self.proj(y.transpose(1, 2).reshape(b, t, c)))

    def mlp(self, x: Tensor) -> Tensor:
        if self.llama:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.drop(self.down(F.silu(gate) * up))
        return self.drop(self.down(F.gelu(self.up(x))))

    def forward(self, inputs: Tuple) -> Tuple:
        x = inputs[0]
        x = x + self.attention(self.norm1(x))
        return (x + self.mlp(self.norm2(x)),)


class Head(Layer):
    """Final norm, then logits [B, T, V]: through the token embedding's own matrix when
    ``tied`` is given (GPT-2), else through a matrix of its own."""

    def __init__(self, width: int, vocab: int, llama: bool, tied: nn.Parameter | None) -> None:
        super().__init__()
        self.norm = _norm(width, llama)
        if tied is not None:
            self.weight = tied  # the same Parameter: tied
        else:
            self.weight = nn.Parameter(torch.empty(vocab, width))
            nn.init.normal_(self.weight, std=STD)

    def forward(self, inputs: Tuple) -> Tuple:
        return (F.linear(self.norm(inputs[0]), self.weight),)


def evaluate(model: LayerModel, data: Dataset, batch_size: int) -> float:
    """Validation perplexity in batches of at most ``EVAL_LOGITS`` logits: the trainers'
    evaluation batch of 128 windows would be 26 GB of logits for GPT-2 (1024 tokens x
    50,257)."""
    seq = int(data.take(torch.tensor([0]))["x"].shape[1])
    per_window = seq * int(data.meta["vocab_size"])
    return evaluate_perplexity(model, data, max(1, min(batch_size, EVAL_LOGITS // per_window)))


def build_variant(model: dict, meta: dict) -> LayerModel:
    """The model a scale's ``model`` settings describe, for data whose ``meta`` may set
    the vocabulary."""
    cfg = {**model, "vocab": int(meta.get("vocab_size", model["vocab"]))}
    llama = cfg["llama"]
    torch.manual_seed(int(meta.get("init_seed", 0)))
    embed = Embed(cfg["vocab"], cfg["width"], cfg["seq"], not llama, cfg["dropout"])
    blocks = [Block(cfg["width"], cfg["heads"], cfg["hidden"], llama, cfg["dropout"],
                    cfg["layers"]) for _ in range(cfg["layers"])]
    head = Head(cfg["width"], cfg["vocab"], llama, None if llama else embed.tokens.weight)
    return LayerModel([embed, *blocks, head])


def parameter_formula(vocab: int, width: int, layers: int, hidden: int, seq: int,
                      llama: bool) -> int:
    """Parameters in closed form (a tied matrix counted once)."""
    if llama:  # no biases; RMSNorm has a weight only; SwiGLU has three matrices
        block = 4 * width * width + 3 * width * hidden + 2 * width
        return 2 * vocab * width + layers * block + width
    block = 4 * width * width + 4 * width + 2 * width * hidden + hidden + width + 4 * width
    return vocab * width + seq * width + layers * block + 2 * width


def _spec(model: dict, batch: int, lr: float, target: float, epochs: int,
          **kw: object) -> ScaleSpec:
    return ScaleSpec(model, batch, lr, target, optimizer="adam", epochs=epochs, **kw)


def _scales(llama: bool) -> dict[str, ScaleSpec]:
    tiny = {"vocab": SOURCES["tiny"].vocab_size, "width": 64, "heads": 4,
            "layers": 4, "seq": 32, "dropout": 0.0, "llama": llama}
    small = {"vocab": SOURCES["small"].vocab_size, "width": 256, "heads": 8,
             "layers": 6, "seq": 128, "dropout": 0.0, "llama": llama}
    if llama:  # SwiGLU width: 8/3 of the model's, as Llama sizes it
        tiny["hidden"], small["hidden"] = 176, 688
        full = {"vocab": 32000, "width": 2048, "heads": 32, "layers": 16, "seq": 2048,
                "hidden": 5632, "dropout": 0.0, "llama": True}
    else:
        tiny["hidden"], small["hidden"] = 256, 1024
        full = {"vocab": 50257, "width": 768, "heads": 12, "layers": 12, "seq": 1024,
                "hidden": 3072, "dropout": 0.0, "llama": False}
    return {
        # no clipping at tiny and small scale: the runtime clips per stage (a global norm
        # would need another all-reduce), which would make the systems differ
        "tiny": _spec(tiny, 32, 3e-3, markov_target("tiny", 1.2), 10),
        "small": _spec(small, 32, 1e-3, markov_target("small", 1.2), 10),
        # nanoGPT's peak learning rate and clipping (without its warm-up, cosine decay,
        # AdamW and 0.5M-token batches); the real-data target is the OpenWebText
        # validation loss of 2.85 nanoGPT reports for GPT-2 124M (perplexity 17.3), which
        # one epoch here is not expected to reach: a GPU job, for throughput and memory
        "full": _spec(full, 8, 6e-4, markov_target("full", 1.2), 1, grad_clip=1.0,
                      real_target=17.3, stall_timeout_s=900.0),
    }


def _workload(name: str, llama: bool) -> Workload:
    style = ("Llama style: RoPE, RMSNorm, SwiGLU, untied head" if llama
             else "GPT-2 style: learned positions, LayerNorm, GELU, tied head")

    def model(scale: str) -> dict:  # the workload's own check names a wrong scale
        return (GPT_LLAMA if llama else GPT).spec(scale).model

    return Workload(
        name=name, description=f"decoder-only transformer, {style}",
        metric="perplexity", higher_is_better=False, scales=_scales(llama),
        build=lambda scale, meta: build_variant(model(scale), meta),
        loss=lm_loss, make_batch=lm_batch, evaluate=evaluate,
        default_data=lambda scale, seed: markov_default(scale, model(scale)["seq"]),
        load_data=lambda path, scale: data_tokens.load(path, model(scale)["seq"]),
        default_data_name="Markov token stream with known entropy rate (no download)",
        real_data_name="nanoGPT train.bin/val.bin (uint16 token ids) or UTF-8 text (bytes)",
        published_parameters=None if llama else 124_439_808,
        static_shapes=True)  # fixed windows of `seq` tokens


GPT = _workload("gpt", llama=False)
GPT_LLAMA = _workload("gpt-llama", llama=True)

