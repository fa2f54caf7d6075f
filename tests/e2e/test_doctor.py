"""`arbiter doctor`: the node's health with a fix per item, checked as the daemon's account."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from arbiter_testing.node import HarnessNode


def doctor(node: HarnessNode) -> tuple[int, dict[str, Any]]:
    out = node.cli("doctor", "--json", timeout=180)
    return out.returncode, json.loads(out.stdout)


def test_doctor_names_each_problem_with_its_fix(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        code, report = doctor(node)
        areas = {i["area"]: i for i in report["items"]}
        assert code == 1 and not areas["daemon"]["ok"] and "arbiter run" in areas["daemon"]["fix"]
        assert not areas["rule files"]["ok"]

        node.add_rule(
            "p",
            {
                "id": "p",
                "match": {"cmdline": ["sleep 1009"]},
                "during": [
                    {
                        "source": {
                            "kind": "jsonl",
                            "path": str(tmp_path / "nowhere" / "e.jsonl"),
                            "event": "s",
                            "field": "p",
                            "on": ["x"],
                        }
                    }
                ],
            },
        )
        node.start()
        # its program is not running: a source that cannot be read yet is no fault
        _, report = doctor(node)
        source = {i["area"]: i for i in report["items"]}["rule p source"]
        assert source["ok"] and "not read while p is not running" in source["detail"]
        node.spawn(["sleep", "1009"])
        node.wait_for(lambda: node.status()["rules"][0]["running"], timeout=20)
        code, report = doctor(node)
        areas = {i["area"]: i for i in report["items"]}
        assert code == 1 and report["healthy"] is False
        assert areas["node config"]["ok"] and areas["rule files"]["ok"] and areas["plugins"]["ok"]
        # the stand-in says it stands in
        assert areas["reader cpu_time"]["ok"] and "standing in for GPU time" in areas["reader cpu_time"]["detail"]
        source = areas["rule p source"]
        assert not source["ok"] and "nowhere" in source["detail"] and source["fix"]
        assert "GPU APIs" in areas and any(a.startswith("GPU API ") for a in areas)
        assert any(a.startswith("GPU device files") for a in areas)
        assert any(a.startswith("other users' processes") for a in areas)
        for item in report["items"]:
            assert item["ok"] or item["fix"], item
    finally:
        node.close()


def test_doctor_shows_what_it_knows_while_the_daemon_checks_and_marks_what_does_not_apply(tmp_path: Path) -> None:
    node = HarnessNode(tmp_path)
    try:
        node.add_rule("p", {"id": "p", "match": {"cmdline": ["sleep 1012"]}})
        node.start()
        out = node.cli("doctor", timeout=180)
        assert "the daemon checks its readers, GPU APIs (probed again)" in out.stderr
        lines = out.stdout.splitlines()
        # the local items come first, printed before the daemon was asked
        assert lines[0].startswith("ok   node config:")
        apis = [line for line in lines if line[5:].startswith("GPU API ")]
        unusable = [line for line in apis if "not usable" in line]
        assert unusable and all(line.startswith("n/a  ") for line in unusable), apis
    finally:
        node.close()


def test_the_node_publishes_its_labels_for_fleet_schedulers(tmp_path: Path) -> None:
    features = tmp_path / "features.d"
    features.mkdir()
    node = HarnessNode(tmp_path)
    try:
        node.add_rule("p", {"id": "p", "match": {"cmdline": ["sleep 1010"]}, "pause_fleet": {"scope": "gpu"}})
        node.start(ARBITER_NFD_FILE=str(features / "arbiter"))
        text = node.wait_for(lambda: (features / "arbiter").exists() and (features / "arbiter").read_text())
        assert text.startswith("# +expiry-time=") and "arbiter-gpu-jobs-admitted=true" in text
        node.spawn(["sleep", "1010"])
        node.wait_for(lambda: "arbiter-gpu-jobs-admitted=false" in (features / "arbiter").read_text(), timeout=20)
        assert [p.name for p in features.iterdir()] == ["arbiter"]  # no dotfile left behind
    finally:
        node.close()
