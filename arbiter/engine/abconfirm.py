"""A twin's confirmation of a certificate another node earned, pure.

A node whose fingerprint matches a published certificate runs one paired run at the
certificate's duty before it adopts it.  The original evidence and the confirmation are
combined in two ways, and ``bench/ab_validity.py`` simulates the whole procedure:

- **Sizing.**  The confirmation has no pilot: the original run's blocks (all of them, so the
  SD's upper limit rests on more degrees of freedom than a 4-block pilot's) size it with the
  same rule a run's pilot does (:func:`arbiter.engine.abstats.blocks_needed`), at least
  :data:`MIN_BLOCKS`.  Its length is fixed before any of its own blocks are seen, so the
  choice of length cannot bias its verdict.
- **Drift.**  The lag-1 autocorrelation the drift-robust interval assumes is estimated over
  the original's blocks and the confirmation's together (the original's stand where a run's
  pilot does: in that estimate, not in R): a short confirmation alone estimates it so poorly
  that the allowance for its error would make its interval several times too wide to decide.
- **Verdict.**  R and its interval are the confirmation's own blocks' (the original's are
  left out of them), the drift-robust 90 % interval.  It adopts only where the lower bound is at or above
  1 − margin, so a twin whose program is slowed by exactly the margin adopts with the same
  chance of at most 5 % that a run of its own would certify it with, whatever the original
  showed.  It *disagrees* where its interval lies wholly below the original's (the twin's
  program is slowed more than the original's, beyond chance) or it shows a slowdown; it is
  *not confirmed* where it is merely inconclusive.  Either way the certificate is refused.

A twin adopts nothing unless the original passed, so in a fleet of true twins (all slowed by
the margin) no node is certified unless the original falsely was: the fleet's false
certification is the original's, at most 5 %; a twin that is not a true twin is held to 5 %
by its own confirmation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from arbiter.engine.abstats import REALISTIC_BLOCKS, Analysis, Block, analyse, blocks_needed

#: the fewest blocks a confirmation runs: the drift-robust interval needs a few to estimate
#: the blocks' autocorrelation at all
MIN_BLOCKS = 8

Outcome = Literal["adopt", "disagrees", "not confirmed"]


def blocks_for(original: Sequence[Block], margin: float) -> int | None:
    """The confirmation's length from the original run's blocks; None where no realistic run
    would show the margin (the original's progress was too noisy to confirm)."""
    if len(original) < 2:
        return None
    needed = blocks_needed(original, margin)
    if needed is None:
        return None
    return min(REALISTIC_BLOCKS, max(MIN_BLOCKS, needed))


@dataclass(frozen=True)
class Judgement:
    outcome: Outcome
    why: str
    analysis: Analysis

    @property
    def adopts(self) -> bool:
        return self.outcome == "adopt"


def judge(
    original: Sequence[Block], original_low: float, original_high: float, blocks: Sequence[Block], margin: float
) -> Judgement:
    """The confirmation's verdict on its own ``blocks`` against the original run's interval,
    the autocorrelation estimated over the ``original`` blocks and these together."""
    a = analyse([*original, *blocks], margin, pilot=len(original), ends=False)
    floor = 1 - margin
    if a.high < original_low or a.verdict == "slowdown":
        return Judgement(
            "disagrees",
            f"here R is {a.r:.4f} (90 % {a.low:.4f}–{a.high:.4f}) over {a.n} blocks, below the original's "
            f"{original_low:.4f}–{original_high:.4f}: the program is slowed more on this node",
            a,
        )
    if not a.certifies:
        # the lower bound, or else what else withheld it (the effect changed during the run)
        short = f"the lower bound is below 1 − margin = {floor:.4f}" if a.low < floor else a.why
        return Judgement(
            "not confirmed", f"here R is {a.r:.4f} (90 % {a.low:.4f}–{a.high:.4f}) over {a.n} blocks: {short}", a
        )
    return Judgement(
        "adopt",
        f"confirmed here over {a.n} blocks: R {a.r:.4f} (90 % {a.low:.4f}–{a.high:.4f}), at or above {floor:.4f}",
        a,
    )
