"""Progress from what a trainer really prints, end to end: a real tqdm bar written to a log
file, read by a real daemon's ``log`` source with a ``count`` group.  The count grows while
the bar is still one line without a newline, and status says over what window a rate is taken
and how long before a first one."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from arbiter_testing.node import HarnessNode

TRAINER = """
import sys, time
from tqdm import tqdm
with open(sys.argv[1], "w") as fh:
    for _ in tqdm(range(600), file=fh, mininterval=0.05):
        time.sleep(0.01)
"""


def test_a_tqdm_bar_is_progress_while_it_is_drawn(tmp_path: Path) -> None:
    pytest.importorskip("tqdm")
    log = tmp_path / "train.log"
    script = tmp_path / "train_tqdm.py"
    script.write_text(TRAINER)
    node = HarnessNode(tmp_path, tick_s=0.5)
    node.add_rule(
        "trainer",
        {
            "id": "trainer",
            "match": {"script": ["train_tqdm.py"]},
            "protect": {
                "metric": "progress_rate",
                "source": {
                    "kind": "log",
                    "path": str(log),
                    "log_regex": r"(?P<count>\d+(?:\.\d+)?[kMG]?)/(?P<total>\d+(?:\.\d+)?[kMG]?) \[",
                },
            },
        },
    )
    try:
        node.start()
        trainer = node.spawn([sys.executable, str(script), str(log)])

        def source() -> dict[str, Any] | None:
            sources = node.known_rule("trainer").get("sources")
            return sources[0] if sources else None

        # mid-bar: counted from the redraws, long before the bar's only newline at its end
        seen = node.wait_for(lambda: (s := source()) and s["count"] >= 100 and trainer.poll() is None and s, 30)
        assert seen["readable"] and seen["rate_window_s"] > 0 and seen["first_rate_after_s"] > 0
        assert b"\n" not in log.read_bytes()  # the bar has not ended its line yet
        assert trainer.wait(timeout=60) == 0
        # every redraw from 0/600 to 600/600 counted once: the bar's whole length
        node.wait_for(lambda: (s := source()) and s["count"] == 600, 15)
    finally:
        node.close()
