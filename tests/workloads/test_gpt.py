"""The GPT workloads against independent references: parameter counts in closed form, the
attention against a hand-written masked softmax, causality, rotary embeddings' relative
positions, the tie, and the token loaders on files written here."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import WorkloadError
from workloads.base import count_parameters
from workloads.data_tokens import load
from workloads.gpt import GPT, GPT_LLAMA, Block, parameter_formula, rope


@pytest.mark.parametrize("workload", [GPT, GPT_LLAMA], ids=["gpt", "llama"])
@pytest.mark.parametrize("scale", ["tiny", "small"])
def test_parameter_count_matches_its_closed_form(workload, scale: str) -> None:  # noqa: ANN001
    cfg = workload.spec(scale).model
    expected = parameter_formula(cfg["vocab"], cfg["width"], cfg["layers"], cfg["hidden"],
                                 cfg["seq"], cfg["llama"])
    assert count_parameters(workload.build(scale, {})) == expected


def test_llama_full_scale_is_about_a_billion_parameters() -> None:
    with torch.device("meta"):  # shapes only: 4 GB otherwise
        n = count_parameters(GPT_LLAMA.build("full", {}))
    # 2 x 32000 x 2048 (embedding, head) + 16 x (4 x 2048^2 + 3 x 2048 x 5632 + 2 x 2048)
    # + 2048 (the final norm), worked out by hand
    assert n == 953_223_168


@pytest.mark.parametrize("llama", [False, True])
def test_attention_equals_a_masked_softmax_by_hand(llama: bool) -> None:
    torch.manual_seed(0)
    block = Block(16, 4, 32, llama, 0.0, 2).eval()
    x = torch.randn(2, 5, 16)
    b, t, c = x.shape
    q, k, v = (z.view(b, t, 4, 4).transpose(1, 2) for z in block.qkv(x).split(c, dim=2))
    if llama:
        q, k = rope(q), rope(k)
    scores = q @ k.transpose(-1, -2) / 2.0  # sqrt(head width 4)
    scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -np.inf)
    ref = block.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, c))
    assert torch.allclose(block.attention(x), ref, atol=1e-6)


@pytest.mark.parametrize("workload", [GPT, GPT_LLAMA], ids=["gpt", "llama"])
def test_a_later_token_never_changes_an_earlier_logit(workload) -> None:  # noqa: ANN001
    model = workload.build("tiny", {}).eval()
    tokens = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(0))
    changed = tokens.clone()
    changed[:, 20:] = (changed[:, 20:] + 1) % 64
    a, b = model((tokens,))[0], model((changed,))[0]
    assert torch.allclose(a[:, :20], b[:, :20], atol=1e-6)
    assert not torch.allclose(a[:, 20:], b[:, 20:])


def test_rope_scores_depend_on_relative_position_only() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def score(tq: int, tk: int) -> float:
        seq = max(tq, tk) + 1
        qs, ks = q.expand(1, 1, seq, 8), k.expand(1, 1, seq, 8)
        return float(rope(qs)[0, 0, tq] @ rope(ks)[0, 0, tk])
    assert score(5, 2) == pytest.approx(score(9, 6), abs=1e-5)
    assert score(5, 2) != pytest.approx(score(5, 4), abs=1e-3)
    x = torch.randn(1, 2, 7, 8)
    assert torch.allclose(rope(x).norm(dim=-1), x.norm(dim=-1), atol=1e-5)  # a rotation


def test_gpt2_head_is_the_embedding_and_llama_is_untied() -> None:
    gpt, llama = GPT.build("tiny", {}), GPT_LLAMA.build("tiny", {})
    assert gpt.layers[-1].weight is gpt.layers[0].tokens.weight
    assert llama.layers[-1].weight is not llama.layers[0].tokens.weight


def test_nanogpt_bin_files_are_windows_of_uint16_ids(tmp_path: Path) -> None:
    ids = np.arange(1000, dtype=np.uint16) * 37 % 50257
    ids.tofile(tmp_path / "train.bin")
    ids[:300].tofile(tmp_path / "val.bin")
    splits = load(str(tmp_path), 16)
    assert len(splits.train) == (1000 - 1) // 16 and len(splits.valid) == (300 - 1) // 16
    assert splits.train.meta["vocab_size"] == 50257  # GPT-2's, without a meta.pkl
    with open(tmp_path / "meta.pkl", "wb") as f:  # nanoGPT's character-level sets have one
        pickle.dump({"vocab_size": 65}, f)
    with pytest.raises(WorkloadError, match="outside the vocabulary of 65"):
        load(str(tmp_path), 16)
    (tmp_path / "meta.pkl").unlink()
    with pytest.raises(WorkloadError, match="not one .bin file"):
        load(str(tmp_path / "train.bin"), 16)
    d = splits.train.take(torch.tensor([3, 0]))
    assert d["x"].dtype == torch.int64
    assert d["x"][0].tolist() == ids[48:64].tolist() and d["y"][0].tolist() == ids[49:65].tolist()
    assert d["x"][1].tolist() == ids[0:16].tolist()
    only = splits.train.take(torch.tensor([3, 0]), keys=("y",))  # a last stage's read
    assert list(only) == ["y"] and torch.equal(only["y"], d["y"])
    (tmp_path / "train.bin").write_bytes(b"\x00\x01\x02")
    with pytest.raises(WorkloadError, match="uint16"):
        load(str(tmp_path), 16)


def test_text_is_read_as_bytes(tmp_path: Path) -> None:
    text = "héllo wörld, " * 40
    (tmp_path / "corpus.txt").write_text(text, encoding="utf-8")
    raw = text.encode("utf-8")
    splits = load(str(tmp_path / "corpus.txt"), 8)
    cut = int(len(raw) * 0.9)
    assert splits.train.meta["vocab_size"] == 256
    assert splits.train.take(torch.tensor([1]))["x"][0].tolist() == list(raw[8:16])
    assert splits.valid.take(torch.tensor([0]))["y"][0].tolist() == list(raw[cut + 1:cut + 9])
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    (tmp_path / "val.txt").write_text(text[:100], encoding="utf-8")
    assert len(load(str(tmp_path), 8).valid) == (len(text[:100].encode()) - 1) // 8
    with pytest.raises(WorkloadError, match="train.bin and val.bin"):
        load(str(tmp_path / "missing"), 8)
