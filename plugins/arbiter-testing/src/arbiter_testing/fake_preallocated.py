"""What the fake model servers that preallocate their memory share: the weights and KV cache
are held whether they work or not, so VRAM cannot say whether they are busy; while their
memory is given up (released, or asleep) only the CUDA context stays.  Each request runs for
``gen_s``, counted in ``running``, and the VRAM and share go to a :class:`VramBoard`.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

from arbiter_testing.fake_http import WORKING_SHARE, FakeApp
from arbiter_testing.vram_board import VramBoard

#: what a server that gave its memory up keeps on the device (its CUDA context and buffers)
CONTEXT_BYTES = 512 << 20


class PreallocatedServer(FakeApp):
    """A fake that holds ``held_bytes`` while its memory is on the device (see :meth:`given_up`)."""

    def __init__(self, board: VramBoard, held_bytes: int, gen_s: float, pid: int | None, port: int) -> None:
        super().__init__(port)
        self.board = board
        self.full_bytes, self.gen_s = held_bytes, gen_s
        self.pid = os.getpid() if pid is None else pid
        self._lock = threading.Lock()
        self.running = 0

    def given_up(self) -> bool:
        """Whether its memory is off the device now (read under the lock)."""
        return False

    def held_bytes(self) -> int:
        with self._lock:
            return CONTEXT_BYTES if self.given_up() else self.full_bytes

    def _publish(self) -> None:
        with self._lock:
            held = CONTEXT_BYTES if self.given_up() else self.full_bytes
            share = WORKING_SHARE if self.running else 0.0
        self.board.set(self.pid, held, share)

    def _work(self, refused: Callable[[], tuple[int, Any] | None]) -> tuple[int, Any] | None:
        """One request's ``gen_s`` of work, counted in ``running``; ``refused`` (called under the
        lock) is the answer where it cannot run now."""
        with self._lock:
            answer = refused()
            if answer is not None:
                return answer
            self.running += 1
        self._publish()
        try:
            time.sleep(self.gen_s)
        finally:
            with self._lock:
                self.running -= 1
            self._publish()
        return None

    def stop(self) -> None:
        super().stop()
        self.board.remove(self.pid)
