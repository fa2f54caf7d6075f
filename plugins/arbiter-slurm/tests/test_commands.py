"""Reading Slurm's commands: squeue --json across releases, scontrol listpids, the ids given to
tasks, a manifest in a job's comment, and a command that fails or hangs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arbiter.plugin import PluginContext
from arbiter.pluginmanager import build_plugin_manager
from arbiter_slurm import commands, hooks, settings

# what Slurm 22.05 prints (trimmed to the fields read), and the shape later releases give
SQUEUE_2205 = {
    "meta": {"Slurm": {"version": {"major": 22, "micro": 8, "minor": 5}}},
    "errors": [],
    "jobs": [
        {
            "job_id": 17,
            "user_id": 65534,
            "user_name": "nobody",
            "job_state": "RUNNING",
            "name": "train.sh",
            "comment": 'arbiter:{"name": "train"}',
            "requeue": True,
            "restart_cnt": 1,
        },
        {"job_id": 18, "user_id": 0, "user_name": "root", "job_state": "PENDING", "name": "x", "comment": ""},
    ],
}
SQUEUE_2311 = {
    "jobs": [
        {
            "job_id": 21,
            "user_id": 1000,
            "user_name": "ana",
            "job_state": ["SUSPENDED"],
            "name": "render",
            "comment": "",
            "requeue": False,
            "restart_cnt": {"set": True, "infinite": False, "number": 0},
        }
    ]
}
LISTPIDS = """PID      JOBID    STEPID   LOCALID GLOBALID
20935    17       batch    0       0
20948    17       batch    -       -
21001    17       0        1       1
"""


def test_squeue_json_of_22_05_and_later() -> None:
    jobs = commands.parse_squeue(json.dumps(SQUEUE_2205))
    assert [(j.job_id, j.uid, j.state, j.requeue, j.restart_count) for j in jobs] == [
        (17, 65534, "RUNNING", True, 1),
        (18, 0, "PENDING", False, 0),
    ]
    (later,) = commands.parse_squeue(json.dumps(SQUEUE_2311))
    assert (later.job_id, later.state, later.restart_count) == (21, "SUSPENDED", 0)


def test_squeue_errors_and_garbage_say_what_was_wrong() -> None:
    with pytest.raises(commands.SlurmError, match="not JSON"):
        commands.parse_squeue("slurm_load_jobs error: Unable to contact slurm controller")
    with pytest.raises(commands.SlurmError, match="Invalid user"):
        commands.parse_squeue(json.dumps({"jobs": [], "errors": [{"error": "Invalid user"}]}))
    with pytest.raises(commands.SlurmError, match="no 'jobs' list"):
        commands.parse_squeue("[]")


def test_listpids_and_task_ids() -> None:
    pids = commands.parse_listpids(LISTPIDS)
    assert [(p.pid, p.step, p.local_id) for p in pids] == [(20935, "batch", 0), (20948, "batch", None), (21001, "0", 1)]
    assert commands.job_key(17, "batch", 0) == "slurm-17"
    assert commands.job_key(17, "0", 1) == "slurm-17.0.1"
    assert commands.job_key("17", "interactive", 0) == "slurm-17"


def test_host_lists() -> None:
    assert commands.expand_hostlist("n1") == ["n1"]
    assert commands.expand_hostlist("n[1-3,7],gpu01") == ["n1", "n2", "n3", "n7", "gpu01"]
    assert commands.expand_hostlist("gpu[08-10]") == ["gpu08", "gpu09", "gpu10"]
    assert commands.expand_hostlist("") == []


def test_a_manifest_in_the_comment() -> None:
    assert commands.manifest_from_comment('arbiter:{"name": "train"}') == {"name": "train"}
    assert commands.manifest_from_comment("nightly run") is None
    with pytest.raises(commands.SlurmError, match="not JSON"):
        commands.manifest_from_comment("arbiter:{name: train}")
    with pytest.raises(commands.SlurmError, match="JSON object"):
        commands.manifest_from_comment('arbiter:["train"]')


def test_a_command_that_fails_or_hangs_says_which_and_why(tmp_path: Path) -> None:
    with pytest.raises(commands.SlurmError, match="not installed"):
        commands.run([str(tmp_path / "no-such-squeue")])
    with pytest.raises(commands.SlurmError, match="failed with exit 3: went wrong"):
        commands.run([sys.executable, "-c", "import sys; print('went wrong', file=sys.stderr); sys.exit(3)"])
    with pytest.raises(commands.SlurmError, match=r"did not answer within 0\.2s"):
        commands.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=0.2)


def test_silent_on_a_node_without_slurm(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert not settings.configured(settings.NodeOptions(node="n1"))
    from arbiter_slurm.plugin import arbiter_scheduler_jobs

    context = PluginContext(tmp_path, sections={"slurm": settings.NodeOptions(node="n1")})
    assert arbiter_scheduler_jobs(node_state=None, context=context) is None


def test_the_job_manifest_from_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("name: nightly\ngpu: {use: shared}\n")
    assert hooks.manifest_for({"ARBITER_MANIFEST": str(path)}, "5") == {"name": "nightly", "gpu": {"use": "shared"}}
    assert hooks.manifest_for({"ARBITER_MANIFEST": '{"name": "inline"}'}, "5") == {"name": "inline"}
    with pytest.raises(hooks.HookError, match="cannot read the job manifest from"):
        hooks.manifest_for({"ARBITER_MANIFEST": str(tmp_path / "missing.yaml")}, "5")


def test_a_hook_finds_its_nodes_config_by_its_slurm_section(tmp_path: Path) -> None:
    folder = tmp_path / "arbiter"
    folder.mkdir()
    (folder / "gpu-a.yaml").write_text("state_dir: /a\nslurm: {node: n1}\n")
    (folder / "gpu-b.yaml").write_text("state_dir: /b\nslurm:\n  node: n2\n")
    (folder / "n3.yaml").write_text("state_dir: /c\n")  # named after its node, no section
    (folder / "broken.yaml").write_text("slurm: [\n")  # not read, and in no one's way
    os.mkfifo(folder / "a-pipe.yaml")  # never opened for reading in full: it would hang the hook
    env = {"SLURM_CONF": str(tmp_path / "slurm.conf")}
    assert hooks.node_config({**env, "SLURMD_NODENAME": "n2"}) == str(folder / "gpu-b.yaml")
    assert hooks.node_config({**env, "SLURMD_NODENAME": "n1"}) == str(folder / "gpu-a.yaml")
    assert hooks.node_config({**env, "SLURMD_NODENAME": "n3"}) == str(folder / "n3.yaml")
    assert hooks.node_config({**env, "SLURMD_NODENAME": "n4"}) is None  # the one arbiter finds itself
    assert hooks.node_config({"ARBITER_SLURM_CONFIGS": str(folder), "SLURMD_NODENAME": "n1"}) == str(
        folder / "gpu-a.yaml"
    )


def test_the_hook_always_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        hooks.main(["nonsense"])
    assert done.value.code == 0
    assert "unknown role 'nonsense'" in capsys.readouterr().err


def test_registered_through_its_entry_point() -> None:
    assert "slurm" in {p["name"] for p in build_plugin_manager().plugins()}


def test_a_task_of_an_array_is_named_by_its_array_and_task() -> None:
    # as squeue --json shows 22.05's array 2: the task that keeps the array's own job id is 2_3
    jobs = commands.parse_squeue(
        json.dumps(
            {
                "jobs": [
                    {"job_id": 4, "array_job_id": 2, "array_task_id": 0, "job_state": "RUNNING"},
                    {"job_id": 2, "array_job_id": 2, "array_task_id": 3, "job_state": "PENDING"},
                    {"job_id": 1, "array_job_id": 0, "array_task_id": None, "job_state": "RUNNING"},
                    {"job_id": 9, "array_job_id": {"set": True, "number": 0}, "array_task_id": {"set": False}},
                ]
            }
        )
    )
    assert [j.key for j in jobs] == ["2_0", "2_3", "1", "9"]
    assert commands.id_from_env({"SLURM_JOB_ID": "4", "SLURM_ARRAY_JOB_ID": "2", "SLURM_ARRAY_TASK_ID": "0"}) == "2_0"
    assert commands.id_from_env({"SLURM_JOB_ID": "4"}) == "4"
    assert commands.job_key("2_0", "batch", 0) == "slurm-2_0"


def test_a_checkpoint_signal_is_read_as_sbatch_takes_it() -> None:
    assert commands.parse_signal("B:USR1@60") == commands.CheckpointSignal("USR1", True)
    assert commands.parse_signal("SIGUSR2") == commands.CheckpointSignal("USR2", False)
    assert commands.parse_signal("10@5") == commands.CheckpointSignal("10", False)
    assert commands.parse_signal("X:USR1") is None
    # a signal no job can catch ends or freezes it: never a checkpoint signal, whoever names it
    for uncatchable in ("KILL", "B:SIGSTOP", "9", "19@30"):
        assert commands.parse_signal(uncatchable) is None, uncatchable
    assert commands.CheckpointSignal("USR1", True).scancel("2_3") == ["scancel", "--signal=USR1", "--batch", "2_3"]
    script = "#!/bin/sh\n# train\n#SBATCH --requeue\n#SBATCH --signal=B:USR1@60\npython train.py\n"
    assert commands.script_signal(script) == commands.CheckpointSignal("USR1", True)
    # sbatch reads no #SBATCH line after the first command
    assert commands.script_signal("#!/bin/sh\necho hi\n#SBATCH --signal=USR1\n") is None
    assert commands.script_signal("#!/bin/sh\n#SBATCH --signal USR2\n") == commands.CheckpointSignal("USR2", False)


def test_arbiter_slurm_help_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ended:
        hooks.main(["--help"])
    assert ended.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: arbiter-slurm") and "TaskProlog=" in out, out


def test_only_slurm_ids_are_claimed_and_none_is_vouched_for_off_slurm(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from arbiter_slurm.plugin import arbiter_scheduler_job_owner

    monkeypatch.setenv("PATH", str(tmp_path))
    context = PluginContext(tmp_path, sections={"slurm": settings.NodeOptions(node="n1")})
    assert arbiter_scheduler_job_owner(job_id="batch-5", context=context) is None
    said = arbiter_scheduler_job_owner(job_id="slurm-5", context=context)
    assert said is not None and said["uid"] is None and "not under Slurm" in said["why"], said


def test_a_node_config_others_may_change_is_not_followed(tmp_path: Path) -> None:
    """The Prolog and Epilog run as root: a configs folder another account owns or may write
    would send them to a daemon of that account's choosing, so the hook refuses it and says why."""
    folder = tmp_path / "arbiter"
    folder.mkdir()
    (folder / "n1.yaml").write_text("state_dir: /a\nslurm: {node: n1}\n")
    env = {"ARBITER_SLURM_CONFIGS": str(folder), "SLURMD_NODENAME": "n1"}
    assert hooks.node_config(env) == str(folder / "n1.yaml")
    folder.chmod(0o777)
    with pytest.raises(
        hooks.HookError, match=r"not safe to follow: the folder .* is writable by its group and everyone"
    ):
        hooks.node_config(env)
    folder.chmod(0o755)
    if os.geteuid() == 0:  # another account's folder
        os.chown(folder, 65534, 65534)
        with pytest.raises(hooks.HookError, match="is owned by uid 65534"):
            hooks.node_config(env)


def test_an_array_tasks_owner_is_found_by_its_task_id(monkeypatch: pytest.MonkeyPatch) -> None:
    """``slurm-2_0`` names task 0 of array 2, whose own job id is another number: the owner
    check asks Slurm for that task and knows it by its array and task."""
    listed = {
        "jobs": [
            {
                "job_id": 4,
                "array_job_id": 2,
                "array_task_id": 0,
                "job_state": "RUNNING",
                "user_id": 1234,
                "user_name": "alice",
                "nodes": "n1",
            }
        ]
    }
    asked: list[list[str]] = []

    def run(cmd: list[str]) -> str:
        asked.append(cmd)
        return json.dumps(listed)

    monkeypatch.setattr(commands, "run", run)
    job = commands.job_here("slurm-2_0", "n1")
    assert job is not None and job.uid == 1234 and asked[0][:4] == ["squeue", "--json", "--jobs", "2_0"]
    assert commands.job_here("slurm-2_1", "n1") is None


def test_the_hooks_start_light() -> None:
    """slurmd waits for the Epilog before a requeued job may be placed again and a task for its
    TaskProlog: the hook program loads the daemon's client, not the plugin API (pydantic, the
    engine) nor the translator, which cost it most of a second on a busy node."""
    code = "import arbiter_slurm.hooks, sys, json; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    loaded = set(json.loads(out.stdout))
    heavy = {"pydantic", "arbiter.plugin", "arbiter.engine", "arbiter_slurm.translator", "arbiter_slurm.plugin"}
    assert not heavy & loaded, f"the hooks load {sorted(heavy & loaded)}"


def test_a_requeued_job_is_placed_from_the_second_after_its_requeue() -> None:
    """slurmctld dates the revoke of a requeued job's credentials as it answers the requeue: its
    new start is accepted from the next whole second (and half a second's slack for the
    clocks), whenever its Epilog ends; not a second after it was seen pending."""
    from arbiter_slurm.slurmjob import credential_wait

    assert credential_wait(100.2, 100.3) == pytest.approx(1.2)
    assert credential_wait(100.9, 101.0) == pytest.approx(0.5)
    assert credential_wait(100.2, 101.5) == 0.0  # its Epilog outlasted it: placed at once
    assert credential_wait(100.2, 104.0) == 0.0
