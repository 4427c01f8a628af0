"""Quality metrics of the workloads, computed the standard way.

- top-1 accuracy for image classification;
- BLEU with sacrebleu (corpus BLEU on detokenised strings, sacrebleu's defaults), as MLPerf
  and the PipeDream paper report for GNMT;
- perplexity = exp(mean token cross-entropy), the language-model metric;
- METEOR 1.5 through pycocoevalcap (it ships the jar and paraphrase table and runs it with
  the machine's Java, no download), the S2VT paper's metric.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Sequence

from torch import Tensor

from core.errors import WorkloadError

__all__ = ["bleu", "meteor", "perplexity", "top1"]


def top1(logits: Tensor, labels: Tensor) -> float:
    """Fraction of rows whose arg-max equals the label."""
    if labels.numel() == 0:
        return 0.0
    return float((logits.argmax(dim=-1) == labels).float().mean())


def bleu(hypotheses: Sequence[str], references: Sequence[str]) -> float:
    """Corpus BLEU (0..100) of whitespace-tokenised strings, one reference each."""
    import sacrebleu

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} references")
    # tokenize="none": our strings are already tokenised (WMT16 BPE, or synthetic tokens).
    return float(sacrebleu.corpus_bleu(list(hypotheses), [list(references)],
                                       tokenize="none").score)


def perplexity(total_nll: float, tokens: int) -> float:
    """exp of the mean negative log-likelihood (nats) per token."""
    if tokens <= 0:
        raise ValueError("perplexity needs at least one token")
    return math.exp(total_nll / tokens)


def meteor(hypotheses: Sequence[str], references: Sequence[Sequence[str]]) -> float:
    """METEOR 1.5 (0..1) of each hypothesis against its list of references."""
    if shutil.which("java") is None:
        raise WorkloadError("METEOR needs Java (pycocoevalcap runs meteor-1.5.jar); install a "
                            "JRE, e.g. `apt-get install default-jre-headless`")
    from pycocoevalcap.meteor.meteor import Meteor

    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} hypotheses but {len(references)} reference lists")
    gts = {i: [r if r.strip() else "<empty>" for r in refs] for i, refs in enumerate(references)}
    res = {i: [h if h.strip() else "<empty>"] for i, h in enumerate(hypotheses)}
    scorer = Meteor()
    try:
        score, _ = scorer.compute_score(gts, res)
    finally:
        _close_meteor(scorer)
    return float(score)


def _close_meteor(scorer: object) -> None:
    proc = getattr(scorer, "meteor_p", None)
    if proc is None:
        return
    try:
        proc.stdin.close()
        proc.kill()
        proc.wait(timeout=10)
    except Exception:  # noqa: BLE001 - best effort cleanup of the Java child
        pass
