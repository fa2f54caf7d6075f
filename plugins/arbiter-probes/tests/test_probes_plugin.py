"""The distribution: every kind registered, options validated, commands run with a timeout."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pytest
from pydantic import ValidationError

import arbiter_probes
from arbiter.plugin import Probe
from arbiter_probes._host import (
    NATIVE_SCRIPT,
    Completed,
    ProbeOptions,
    ToolFailed,
    failure_detail,
    native_query,
    run_command,
    tool_output,
)

KINDS = ["cuda", "rocm", "vulkan", "opencl", "metal", "directml", "containers"]
SOURCE = Path(arbiter_probes.__file__).parent

FIXTURES = Path(__file__).parent / "fixtures"


def test_every_kind_is_registered_as_a_probe() -> None:
    seen: dict[str, type[Probe]] = {}
    arbiter_probes.arbiter_register_probes(lambda name, cls: seen.__setitem__(name, cls))
    assert sorted(seen) == sorted(KINDS)
    for name, cls in seen.items():
        assert issubclass(cls, Probe)
        options = cls.Options()  # the core builds a probe from default options
        assert isinstance(options, ProbeOptions)
        assert options.model_dump()["kind"] == name and options.timeout_s == 5


def test_the_docstring_lists_every_kind() -> None:
    for kind in KINDS:
        assert f"``{kind}``" in (arbiter_probes.__doc__ or "")


def test_the_entry_point_names_the_package() -> None:
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="arbiter")}
    assert names.get("probes") == "arbiter_probes"


@pytest.mark.parametrize("kind", KINDS)
def test_options_forbid_unknown_fields_and_bad_timeouts(kind: str) -> None:
    cls = arbiter_probes.PROBES[kind]
    assert cls.Options.model_validate({"kind": kind, "timeout_s": 2.5}).timeout_s == 2.5
    with pytest.raises(ValidationError):
        cls.Options.model_validate({"kind": kind, "command": "x"})
    with pytest.raises(ValidationError):
        cls.Options.model_validate({"kind": kind, "timeout_s": 0})


def test_plugins_import_only_the_public_plugin_api_from_arbiter() -> None:
    for path in SOURCE.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "arbiter":
                assert node.module == "arbiter.plugin", f"{path.name} imports {node.module}"
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert alias.name.split(".")[0] != "arbiter", f"{path.name} imports {alias.name}"


def test_the_native_script_uses_only_the_standard_library() -> None:
    tree = ast.parse(NATIVE_SCRIPT.read_text())
    modules: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module.split(".")[0])
    assert modules <= set(sys.stdlib_module_names) | {"__future__"}


# --- running commands -------------------------------------------------------------------------------


def test_a_missing_program_says_it_is_not_installed() -> None:
    with pytest.raises(ToolFailed) as caught:
        tool_output(run_command, ["no-such-probe-tool-here", "--x"], 5, {"PATH": "/nonexistent"})
    assert str(caught.value) == "no-such-probe-tool-here is not installed (not found on PATH)"
    assert caught.value.missing


def test_a_command_that_overruns_is_killed_at_its_timeout() -> None:
    import time

    started = time.monotonic()
    with pytest.raises(ToolFailed) as caught:
        tool_output(run_command, [sys.executable, "-c", "import time; time.sleep(30)"], 0.5, {"PATH": ""})
    assert time.monotonic() - started < 5
    assert str(caught.value) == "a child Python process did not finish within 0.5 s"


def test_a_failing_command_shows_its_error_lines() -> None:
    script = "import sys; print('ERROR: first thing'); print('noise'); print('Error: last thing'); sys.exit(3)"
    with pytest.raises(ToolFailed) as caught:
        tool_output(run_command, [sys.executable, "-c", script], 5, {"PATH": ""})
    assert str(caught.value) == "a child Python process failed (exit 3): ERROR: first thing; Error: last thing"


def test_a_command_gets_no_shell_and_the_given_environment(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    script = "import os, sys; print(os.environ.get('PROBE_VAR'), sys.argv[1])"
    done = run_command([sys.executable, "-c", script, f"; touch {marker}"], 5, {"PROBE_VAR": "given", "PATH": ""})
    assert done == Completed(0, f"given ; touch {marker}\n", "")
    assert not marker.exists()


def test_failure_detail_strips_the_vulkan_loader_prefix() -> None:
    stderr = (FIXTURES / "vulkaninfo" / "summary-debian12-driver-library-missing.stderr.txt").read_text()
    assert failure_detail(stderr) == (
        "/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so: cannot open shared object file: No such file or directory; "
        "ERROR at ./vulkaninfo/vulkaninfo.h:674:vkCreateInstance failed with ERROR_INCOMPATIBLE_DRIVER"
    )
    assert failure_detail("just one line\n") == "just one line"
    assert failure_detail("") == ""


def test_a_native_child_that_prints_no_report_is_a_failure() -> None:
    def run(argv: object, timeout_s: float, env: object) -> Completed:
        return Completed(0, "garbage\n")

    with pytest.raises(ToolFailed, match="the cuda query printed no report: garbage"):
        native_query(run, "cuda", 5, {})


def test_a_native_child_that_crashes_is_a_failure() -> None:
    def run(argv: object, timeout_s: float, env: object) -> Completed:
        return Completed(-11, "", "")

    with pytest.raises(ToolFailed, match=r"a child Python process failed \(exit -11\): no output"):
        native_query(run, "vulkan", 5, {})


def test_a_native_child_that_hangs_is_a_failure() -> None:
    def run(argv: Sequence[str], timeout_s: float, env: Mapping[str, str]) -> Completed:
        raise subprocess.TimeoutExpired(argv, timeout_s)

    with pytest.raises(ToolFailed, match="did not finish within 5 s"):
        native_query(run, "opencl", 5, {})


def test_the_native_script_refuses_an_unknown_query() -> None:
    done = subprocess.run(
        [sys.executable, "-I", "-S", str(NATIVE_SCRIPT), "bogus"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2 and "usage" in done.stdout
