"""What the node state observers say they told their schedulers, in the shape status shows."""

from __future__ import annotations

from arbiter.daemon.fleetstate import labels_told


def test_answers_are_kept_in_one_shape_and_the_others_left_out() -> None:
    answers = [
        None,
        {"scheduler": "batch", "node": "n2", "labels": ["b", "a"]},
        "not a mapping",
        {"scheduler": "batch", "node": "n1", "labels": "admit"},  # labels not a list
        {"scheduler": "grid", "node": "n1", "labels": [1], "error": "the controller did not answer"},
    ]
    assert labels_told(answers) == [
        {"scheduler": "batch", "node": "n2", "labels": ["a", "b"], "error": ""},
        {"scheduler": "grid", "node": "n1", "labels": ["1"], "error": "the controller did not answer"},
    ]
    assert labels_told(None) == []
