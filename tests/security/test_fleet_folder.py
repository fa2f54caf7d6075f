"""Attacks by the account ``nobody`` through the shared certificate folder, read by a root
daemon: a FIFO that would hold its reading worker for ever, a link to a root-only file, a
folder the daemon's account may not read that must not read as empty."""

from __future__ import annotations

import os
import threading
from pathlib import Path

from arbiter.state import fleetcerts as files
from arbiter_testing import wait_until

from .conftest import Background, needs_root


@needs_root
def test_a_fifo_or_a_link_nobody_leaves_in_the_folder_neither_holds_nor_reads_for_root(shared_root: Path) -> None:
    secret_dir = shared_root / "root-only"
    secret_dir.mkdir(mode=0o700)
    secret = secret_dir / "shadow"
    secret.write_text('{"payload": "root\'s own", "signature": ""}')
    folder = shared_root / "certs"
    folder.mkdir()
    os.chmod(folder, 0o777)  # a folder left writable by every account
    fifo, link = folder / "a.trainer.gpu.cert.json", folder / "b.trainer.gpu.cert.json"

    def plant() -> list[int]:
        os.mkfifo(fifo)
        link.symlink_to(secret)
        return [fifo.lstat().st_uid, link.lstat().st_uid]

    assert Background("nobody", plant).join() != [0, 0]
    done: list[list[files.Published | files.Refused]] = []
    threading.Thread(target=lambda: done.append(files.scan(folder, {}, {}, "gpu-07")), daemon=True).start()
    wait_until(lambda: done, timeout_s=10, what="root's scan to return past the FIFO")
    whys = {r.path.name: (r.code, r.why) for r in done[0] if isinstance(r, files.Refused)}
    assert whys[fifo.name][0] == whys[link.name][0] == "FLEET_CERT_CORRUPT"
    assert "regular file" in whys[fifo.name][1] and "symbolic link" in whys[link.name][1]
    assert not any("root's own" in why for _, why in whys.values())


@needs_root
def test_a_folder_its_reader_may_not_list_is_an_error_not_empty(shared_root: Path) -> None:
    folder = shared_root / "certs"
    folder.mkdir(mode=0o700)
    (folder / "a.trainer.gpu.cert.json").write_text("{}")

    def scan() -> str:
        try:
            files.scan(folder, {}, {}, "gpu-07")
        except OSError as exc:
            return type(exc).__name__
        return "read as empty"

    assert Background("nobody", scan).join() == "PermissionError"
