"""Certificates: valid 14 days, and only on the node and program they were earned on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from arbiter import __version__
from arbiter.state.certificates import VALID_S, Certificate, ExeHasher, fingerprint, status
from arbiter.state.store import Store

NODE = {"cpu": "AMD EPYC", "gpus": ["NVIDIA H200"], "os": "linux 6", "arbiter": __version__}
EXE = ("/opt/trainer/bin/train", "ab" * 32)


def cert(issued_at: float = 1000.0, **kw: Any) -> Certificate:
    fields = dict(
        rule="trainer",
        work="gpu",
        duty=0.35,
        r=0.99,
        r_low=0.981,
        r_high=1.002,
        margin=0.02,
        run_id="ab-7",
        issued_at=issued_at,
        node="gpu-box",
        fingerprint=NODE,
        exe_path=EXE[0],
        exe_sha256=EXE[1],
    )
    return Certificate(**{**fields, **kw})


def test_valid_for_fourteen_days() -> None:
    assert status(cert(), 1000.0 + VALID_S - 1, NODE, EXE)[0] == "valid"
    state, why = status(cert(), 1000.0 + VALID_S, NODE, EXE)
    assert state == "expired" and "14 days" in why and "arbiter ab sweep --rule trainer" in why


def test_stale_when_the_node_changed() -> None:
    for key, value in (("cpu", "Intel Xeon"), ("gpus", ["NVIDIA A100"]), ("os", "linux 7"), ("arbiter", "9.9")):
        state, why = status(cert(), 2000.0, {**NODE, key: value}, EXE)
        assert state == "stale" and key in why, key


def test_stale_when_the_program_changed_and_unjudged_while_it_does_not_run() -> None:
    assert status(cert(), 2000.0, NODE, ("/opt/other", EXE[1]))[0] == "stale"
    state, why = status(cert(), 2000.0, NODE, (EXE[0], "cd" * 32))
    assert state == "stale" and "changed" in why
    assert status(cert(), 2000.0, NODE, None)[0] == "valid"


def test_the_store_keeps_certificates(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    first = store.add_certificate(cert())
    store.add_certificate(cert(issued_at=2000.0, duty=0.5))
    got = store.certificates()
    assert [c.duty for c in got] == [0.35, 0.5] and got[0].id == first and dict(got[0].fingerprint) == NODE
    store.close()


def test_executables_are_hashed_once_per_version(tmp_path: Path) -> None:
    exe = tmp_path / "prog"
    exe.write_bytes(b"one")
    hasher = ExeHasher()
    first = hasher.digest(str(exe))
    assert first == hasher.digest(str(exe)) and len(first or "") == 64
    exe.write_bytes(b"two, longer")
    os.utime(exe, ns=(1, 1))
    assert hasher.digest(str(exe)) != first
    assert hasher.digest(str(tmp_path / "missing")) is None


def test_fingerprint_shape() -> None:
    fp = fingerprint({"cpu_model": "Apple M2", "os": "darwin 23"}, ["Apple M2 GPU"])
    assert fp == {"cpu": "Apple M2", "gpus": ["Apple M2 GPU"], "driver": "", "os": "darwin 23", "arbiter": __version__}
    assert fingerprint({}, [], "nvidia 550.54.15")["driver"] == "nvidia 550.54.15"


def test_a_slowdown_at_a_duty_retires_the_certificates_at_that_duty_or_above(tmp_path: Path) -> None:
    store = Store(tmp_path / "state.db")
    try:
        for duty in (0.2, 0.5, 0.8):
            store.add_certificate(cert(duty=duty, issued_at=1000.0 + duty))
        store.add_certificate(cert(duty=0.8, work="batch"))  # other work stands
        with store.transaction() as db:
            assert Store.supersede(db, "trainer", "gpu", 0.5, "ab-9", "run ab-9 showed a slowdown at duty 0.5") == 2
        states = {(c.work, c.duty): status(c, 2000.0, NODE, EXE) for c in store.certificates()}
        assert states[("gpu", 0.2)][0] == "valid" and states[("batch", 0.8)][0] == "valid"
        assert states[("gpu", 0.5)] == ("stale", "run ab-9 showed a slowdown at duty 0.5")
        assert states[("gpu", 0.8)][0] == "stale"
    finally:
        store.close()


def test_a_new_gpu_driver_makes_a_certificate_stale_and_one_from_before_drivers_holds_where_none_is_known() -> None:
    with_driver = {**NODE, "driver": "nvidia 550.54.15"}
    earned = cert(fingerprint=with_driver)
    assert status(earned, 2000.0, with_driver, EXE)[0] == "valid"
    state, why = status(earned, 2000.0, {**NODE, "driver": "nvidia 560.28.03"}, EXE)
    assert state == "stale" and "driver was 'nvidia 550.54.15', now 'nvidia 560.28.03'" in why
    older = cert(fingerprint=NODE)  # recorded before drivers were
    assert status(older, 2000.0, {**NODE, "driver": ""}, EXE)[0] == "valid"
    assert status(older, 2000.0, with_driver, EXE)[0] == "stale"
