"""Which filesystem a followed file is open on: read from the real /proc, and from sample
mountinfo texts."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from arbiter_sources import follow_fs

_SAMPLE = "\n".join(
    [
        "22 27 0:21 / /proc rw,relatime shared:12 - proc proc rw",
        "27 1 259:2 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p2 rw,errors=remount-ro",
        # a mount point with a space, a dash in a path and two optional fields
        r"88 27 0:51 /exports/a\040b /home/my\040home\040- rw,relatime shared:40 master:7 - nfs4 srv:/e rw,vers=4.2",
        # no optional fields at all
        "91 27 0:60 / /mnt/fs rw - fuse.sshfs me@host:/ rw,user_id=0",
        "95 27 0:61 / /mnt/broken rw shared:3",  # no separator: not read
    ]
)


@pytest.mark.parametrize(
    ("mnt_id", "fs_type"), [(22, "proc"), (27, "ext4"), (88, "nfs4"), (91, "fuse.sshfs"), (95, None), (7, None)]
)
def test_a_mounts_type_is_read_past_escaped_spaces_and_optional_fields(mnt_id: int, fs_type: str | None) -> None:
    assert follow_fs.mount_fs_type(_SAMPLE, mnt_id) == fs_type


def test_an_open_files_type_is_read_from_this_machines_proc(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    path.touch()
    fd = os.open(path, os.O_RDONLY)
    try:
        fs_type = follow_fs.fd_fs_type(fd)
    finally:
        os.close(fd)
    assert fs_type
    types = {line.split(" - ", 1)[1].split(" ")[0] for line in Path("/proc/self/mountinfo").read_text().splitlines()}
    assert fs_type in types


@pytest.mark.parametrize(
    ("fs_type", "remote"),
    [
        ("nfs", True),
        ("nfs4", True),
        ("cifs", True),
        ("smb3", True),
        ("ceph", True),
        ("9p", True),
        ("lustre", True),
        ("fuse.sshfs", True),
        ("fuse", True),
        (None, True),
        ("", True),
        ("ext4", False),
        ("xfs", False),
        ("btrfs", False),
        ("tmpfs", False),
        ("overlay", False),
        ("zfs", False),
    ],
)
def test_network_fuse_and_unknown_filesystems_count_as_remote(fs_type: str | None, remote: bool) -> None:
    assert follow_fs.is_remote(fs_type) is remote
