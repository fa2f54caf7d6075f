"""A path in a folder another account may change is opened without a race: checked on the
descriptor before anything is read, so a FIFO or a device swapped in after a check is never
opened for reading (a FIFO's open blocks; a device's may act)."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from arbiter.plugin import PluginContext
from arbiter_sources import JsonlSource
from arbiter_sources.safeopen import NotRegularFile, open_regular


class BlockedWriter:
    """A writer opening ``fifo``: its open returns only once some reader opened it."""

    def __init__(self, fifo: Path) -> None:
        self.fifo = fifo
        self.opened = threading.Event()
        self.thread = threading.Thread(target=self._open, daemon=True)
        self.thread.start()

    def _open(self) -> None:
        fd = os.open(self.fifo, os.O_WRONLY)
        self.opened.set()
        os.close(fd)

    def release(self) -> bool:
        """Whether a reader had opened it; then lets the writer go."""
        was = self.opened.wait(0.3)
        if not was:
            fd = os.open(self.fifo, os.O_RDONLY | os.O_NONBLOCK)
            self.thread.join(5)
            os.close(fd)
        return was


def test_open_regular_reads_a_file_and_never_opens_anything_else(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("line\n")
    fd, st = open_regular(str(plain))
    assert os.read(fd, 10) == b"line\n" and st.st_size == 5
    os.close(fd)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    (tmp_path / "link").symlink_to(fifo)
    for name in ("fifo", "link"):
        writer = BlockedWriter(fifo)
        with pytest.raises(NotRegularFile):
            open_regular(str(tmp_path / name))
        assert not writer.release(), f"the FIFO behind {name} was opened for reading"
    with pytest.raises(NotRegularFile, match="directory"):
        open_regular(str(tmp_path))
    (tmp_path / "to-plain").symlink_to(plain)
    with pytest.raises(OSError) as caught:
        open_regular(str(tmp_path / "to-plain"), follow_links=False)
    assert caught.value.errno == errno.ELOOP


def test_a_fifo_swapped_in_after_the_check_is_not_opened_by_a_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The source's check (``stat``) sees a regular file; the path is a FIFO by the time it
    opens it, as after a swap by the folder's owner in between."""
    events = tmp_path / "events.jsonl"
    events.write_text("")
    regular = os.stat(events)
    events.unlink()
    os.mkfifo(events)
    real_stat = os.stat

    def stat_before_the_swap(path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        return regular if str(path) == str(events) else real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat_before_the_swap)  # the os module follow reads
    writer = BlockedWriter(events)
    options = JsonlSource.Options.model_validate(
        {"kind": "jsonl", "path": str(events), "event": "status", "field": "phase", "on": ["on"]}
    )
    source = JsonlSource(options, PluginContext(state_dir=tmp_path))
    try:
        source.start(lambda state: None)
        state = source.state()
        assert not state.readable and "not a regular file" in state.why, state
    finally:
        source.close()
        monkeypatch.undo()
    assert not writer.release(), "the source opened the FIFO for reading"
