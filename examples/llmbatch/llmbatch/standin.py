"""A deterministic pure-Python stand-in for a language model (CPU units, exact output).

It is a real (tiny) model, not a timer: a fixed pseudo-random embedding and weight matrix,
a recurrent hidden state, and greedy decoding over a small vocabulary.  Pure Python floats
are IEEE doubles, so the same prompt gives the same text on every machine; the golden file
pins it.  ``width`` sets how much arithmetic one step does (≈ width² multiply-adds), so a
generation step can be made to last from a few to a hundred milliseconds.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

VOCAB = list(" etaoinshrdlucmfwypvbgkqjxz.,")
SEED = 20261129


def _rng(seed: int) -> Iterator[float]:
    """A small LCG in [-1, 1): the weights, without depending on the random module."""
    state = seed
    while True:
        state = (state * 6364136223846793005 + 1442695040888963407) % (1 << 64)
        yield (state >> 11) / float(1 << 52) - 1.0


class StandInModel:
    name = "stand-in"
    device = "cpu"

    def __init__(self, width: int = 64) -> None:
        if width < 4:
            raise ValueError("width must be at least 4")
        self.width = width
        r = _rng(SEED)
        # drawn before the work matrix, so the decoded text does not depend on the width
        self.embed = [[next(r) for _ in range(16)] for _ in VOCAB]
        self.out = [[next(r) for _ in range(16)] for _ in VOCAB]
        self.mix = [[next(r) * 0.5 for _ in range(width)] for _ in range(width)]
        self.reset()

    def reset(self) -> None:
        self.state = [0.0] * 16

    def tokenize(self, text: str) -> list[int]:
        return [VOCAB.index(c) if c in VOCAB else 0 for c in text.lower()]

    def detokenize(self, tokens: list[int]) -> str:
        return "".join(VOCAB[t] for t in tokens)

    def _work(self) -> float:
        """The bulk of a step: a width × width mat-vec over the state, the cost a real
        model's layers have.  Decoding does not read it, so the text is the same at any width."""
        h = self.state + [0.0] * (self.width - 16)
        acc = 0.0
        for row in self.mix:
            s = 0.0
            for w, x in zip(row, h, strict=True):
                s += w * x
            acc += s
        return acc

    def feed(self, token: int) -> None:
        """Take one token into the state (one prefill position)."""
        self._work()
        e = self.embed[token]
        self.state = [math.tanh(0.6 * s + e[i]) for i, s in enumerate(self.state)]

    def next_token(self) -> int:
        """The greedy next token after the state (one generation step), and take it in."""
        self._work()
        scores = [sum(w * s for w, s in zip(row, self.state, strict=True)) for row in self.out]
        token = max(range(len(scores)), key=scores.__getitem__)
        e = self.embed[token]
        self.state = [math.tanh(0.6 * s + e[i]) for i, s in enumerate(self.state)]
        return token
