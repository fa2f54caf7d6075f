"""The shipped systemd units parse and carry what running arbiter as a service needs."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = ROOT / "examples" / "systemd"


def unit(name: str) -> dict[str, dict[str, list[str]]]:
    """Sections → keys → every value (a key may repeat in a unit file)."""
    parsed: dict[str, dict[str, list[str]]] = {}
    section = None
    for n, raw in enumerate((UNITS / name).read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            parsed.setdefault(section, {})
            continue
        assert section is not None, f"{name}:{n}: a key before any section"
        assert "=" in line, f"{name}:{n}: not KEY=VALUE: {line!r}"
        key, value = (s.strip() for s in line.split("=", 1))
        parsed[section].setdefault(key, []).append(value)
    return parsed


def one(u: dict[str, dict[str, list[str]]], section: str, key: str) -> str:
    values = u[section].get(key)
    assert values, f"[{section}] has no {key}="
    return values[-1]


def test_unit_files_are_ini() -> None:
    for name in ("arbiter.service", "arbiter-helper.service"):
        cp = configparser.ConfigParser(interpolation=None, strict=False)
        cp.optionxform = str  # type: ignore[assignment,method-assign]
        cp.read_string((UNITS / name).read_text())
        assert {"Unit", "Service", "Install"} <= set(cp.sections())


def test_the_daemon_unit() -> None:
    u = unit("arbiter.service")
    s = "Service"
    assert one(u, s, "Type") == "notify"
    assert one(u, s, "WatchdogSec")
    assert one(u, s, "Restart") == "on-failure"
    assert one(u, s, "ExecStart").split() == ["/usr/bin/arbiter", "run", "--config", "/etc/arbiter/arbiter.yaml"]
    assert "-HUP" in one(u, s, "ExecReload") and "$MAINPID" in one(u, s, "ExecReload")
    assert one(u, s, "ExecStopPost").lstrip("-").split()[:2] == ["/usr/bin/arbiter", "resume-all"]
    assert one(u, s, "StateDirectory") == "arbiter"
    assert one(u, s, "NoNewPrivileges") == "yes"
    assert one(u, s, "ProtectSystem") == "strict"
    assert one(u, s, "PrivateTmp") == "yes"
    assert "/var/lib/arbiter" in one(u, s, "ReadWritePaths").split()
    families = set(one(u, s, "RestrictAddressFamilies").split())
    assert {"AF_UNIX", "AF_INET", "AF_INET6"} <= families
    caps = set(one(u, s, "CapabilityBoundingSet").split())
    assert {"CAP_KILL", "CAP_SYS_PTRACE"} <= caps  # other users' processes and their fdinfo
    # hardening that would make it useless: no GPU devices, no process table, no freezing
    for useless in (
        "PrivateDevices",
        "ProtectControlGroups",
        "ProtectKernelTunables",
        "PrivateUsers",
        "MemoryDenyWriteExecute",
    ):
        assert useless not in u[s], f"{useless}= would keep the daemon from its work"
    assert u[s].get("ProtectProc", ["default"])[-1] == "default"  # it must see every process
    assert one(u, "Install", "WantedBy") == "multi-user.target"


def test_the_helper_user_unit() -> None:
    u = unit("arbiter-helper.service")
    argv = one(u, "Service", "ExecStart").split()
    assert argv[:2] == ["/usr/bin/arbiter", "helper"]
    assert one(u, "Service", "Restart") == "on-failure"
    assert one(u, "Install", "WantedBy") == "default.target"


def test_the_units_name_real_options() -> None:
    """Every arbiter flag the units use exists (the CLI's own --help says so)."""
    for name in ("arbiter.service", "arbiter-helper.service"):
        u = unit(name)
        for key in ("ExecStart", "ExecStopPost"):
            for line in u["Service"].get(key, []):
                argv = line.lstrip("-").split()
                command = next(a for a in argv[1:] if not a.startswith("-"))
                flags = [a for a in argv[1:] if a.startswith("--")]
                out = subprocess.run(
                    [sys.executable, "-m", "arbiter", command, "--help"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                    check=False,
                )
                assert out.returncode == 0, out.stderr
                for flag in flags:
                    assert flag in out.stdout, f"{name}: `arbiter {command}` has no {flag}"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    # verify checks that ExecStart= binaries exist: point them at this environment's arbiter
    arbiter = Path(sys.executable).parent / "arbiter"
    assert arbiter.exists(), f"no arbiter console script beside {sys.executable}"
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    for name, scope in (("arbiter.service", []), ("arbiter-helper.service", ["--user"])):
        copy = tmp_path / name
        copy.write_text((UNITS / name).read_text().replace("/usr/bin/arbiter", str(arbiter)))
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        out = subprocess.run(
            ["systemd-analyze", *scope, "verify", str(copy)],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=False,
        )
        ours = [line for line in (out.stdout + out.stderr).splitlines() if name in line]
        assert out.returncode == 0 and not ours, f"systemd-analyze verify {name}:\n{out.stdout}{out.stderr}"
