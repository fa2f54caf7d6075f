"""The backends llmbatch can run on, and whether each can load here.

Only the stand-in is always there.  llama.cpp (llama-cpp-python, a GGUF file from the models
folder) and MLX (mlx-lm, Apple silicon) load only where installed; ``auto`` picks MLX where it
is installed, else llama.cpp.  Beside a protected program a backend gets a memory limit, never
a wired one: wired memory cannot be paged out when the protected program needs it back.
"""

from __future__ import annotations

import importlib.util
import platform
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from llmbatch.standin import StandInModel


class Model(Protocol):
    name: str
    device: str

    def reset(self) -> None: ...
    def tokenize(self, text: str) -> list[int]: ...
    def detokenize(self, tokens: list[int]) -> str: ...
    def feed(self, token: int) -> None: ...
    def next_token(self) -> int: ...


@dataclass(frozen=True)
class Availability:
    backend: str
    loads: bool
    why: str


def _gguf(models: Path) -> Path | None:
    found = sorted(models.glob("*.gguf")) if models.is_dir() else []
    return found[0] if found else None


def doctor(models: Path) -> list[Availability]:
    out = [Availability("stand-in", True, "pure Python, CPU units; always loads")]
    if importlib.util.find_spec("mlx_lm") is None:
        out.append(Availability("mlx", False, "mlx-lm is not installed (it runs on Apple silicon: pip install mlx-lm)"))
    elif platform.system() != "Darwin" or platform.machine() != "arm64":
        out.append(Availability("mlx", False, "MLX needs macOS on Apple silicon"))
    else:
        out.append(Availability("mlx", True, "mlx-lm is installed; models load from the Hugging Face cache"))
    if importlib.util.find_spec("llama_cpp") is None:
        out.append(Availability("llama.cpp", False, "llama-cpp-python is not installed (pip install llama-cpp-python)"))
    elif _gguf(models) is None:
        out.append(
            Availability("llama.cpp", False, f"no .gguf model in {models} (llmbatch ships none and downloads none)")
        )
    else:
        out.append(Availability("llama.cpp", True, f"would load {_gguf(models)}"))
    return out


class LlamaCppModel:
    """llama-cpp-python: one eval per prefill position or generated token (a GPU unit)."""

    name = "llama.cpp"
    device = "gpu"

    def __init__(self, path: Path) -> None:
        from llama_cpp import Llama  # only here: the stand-in needs none of it

        self._llm = Llama(model_path=str(path), n_gpu_layers=-1, use_mlock=False, verbose=False)  # never wired
        self._tokens: list[int] = []

    def reset(self) -> None:
        self._llm.reset()
        self._tokens = []

    def tokenize(self, text: str) -> list[int]:
        return list(self._llm.tokenize(text.encode()))

    def detokenize(self, tokens: list[int]) -> str:
        return self._llm.detokenize(tokens).decode("utf-8", "replace")

    def feed(self, token: int) -> None:
        self._llm.eval([token])  # returns once the GPU finished it

    def next_token(self) -> int:
        token = int(self._llm.sample(temp=0.0))
        self._llm.eval([token])
        return token


class MlxModel:
    """mlx-lm: a memory limit (never a wired one) and one step per token."""

    name = "mlx"
    device = "gpu"

    def __init__(self, repo: str, memory_limit_bytes: int | None) -> None:
        import mlx.core as mx
        from mlx_lm import load

        if memory_limit_bytes:
            mx.metal.set_memory_limit(memory_limit_bytes)
        self._mx = mx
        self._model, self._tok = load(repo)
        self.reset()

    def reset(self) -> None:
        from mlx_lm.models.cache import make_prompt_cache

        self._cache = make_prompt_cache(self._model)
        self._logits: Any = None

    def tokenize(self, text: str) -> list[int]:
        return list(self._tok.encode(text))

    def detokenize(self, tokens: list[int]) -> str:
        return str(self._tok.decode(tokens))

    def _step(self, token: int) -> None:
        logits = self._model(self._mx.array([[token]]), cache=self._cache)
        self._mx.eval(logits)  # the unit ends when the GPU has finished it
        self._logits = logits

    def feed(self, token: int) -> None:
        self._step(token)

    def next_token(self) -> int:
        token = int(self._mx.argmax(self._logits[0, -1]).item())
        self._step(token)
        return token


def load(backend: str, models: Path, width: int, memory_limit_bytes: int | None) -> Model:
    if backend == "auto":
        table = {a.backend: a for a in doctor(models)}
        backend = "mlx" if table["mlx"].loads else "llama.cpp" if table["llama.cpp"].loads else "stand-in"
    if backend == "stand-in":
        return StandInModel(width)
    if backend == "llama.cpp":
        path = _gguf(models)
        if path is None:
            raise SystemExit(f"llmbatch: no .gguf model in {models}")
        return LlamaCppModel(path)
    if backend == "mlx":
        return MlxModel(
            str(next(iter(models.glob("*")), "mlx-community/Qwen2.5-0.5B-Instruct-4bit")), memory_limit_bytes
        )
    raise SystemExit(f"llmbatch: unknown backend {backend!r} (stand-in, llama.cpp, mlx, auto)")


def tokens_stream(model: Model, steps: int) -> Iterator[int]:
    for _ in range(steps):
        yield model.next_token()
