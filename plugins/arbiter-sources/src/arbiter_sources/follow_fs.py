"""Which filesystem an open file lives on, and whether its notifications can be trusted.

A network filesystem does not tell a file's own watch everything a local one does: on NFS a
file deleted while something holds it open is renamed to ``.nfsXXXX`` instead, and its watch
hears no change of its link count; a FUSE filesystem sends what its server chooses.  Such a
file's folder stays watched for everything that happens beside it.
"""

from __future__ import annotations

import re

#: filesystems whose open files' own watches may miss a delete or a rename over them
_REMOTE = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "ceph", "9p", "afs", "lustre", "gpfs", "glusterfs", "fuse", "fuseblk"}
)

_MNT_ID = re.compile(rb"^mnt_id:\s*(\d+)\s*$", re.MULTILINE)


def is_remote(fs_type: str | None) -> bool:
    """True for a network or FUSE filesystem, and for one not known (the full watch is
    always correct, the quiet one only where the file's own watch hears it leave the path)."""
    if not fs_type:
        return True
    return fs_type in _REMOTE or fs_type.startswith("fuse.")


def mount_fs_type(mountinfo: str, mnt_id: int) -> str | None:
    """The filesystem type of mount ``mnt_id`` in a ``/proc/<pid>/mountinfo`` text, or None.

    A line is ``id parent major:minor root mountpoint options [optional fields...] - type
    source super-options``; paths have their spaces escaped (``\\040``), so fields split on
    spaces, and the optional fields end at the lone ``-``."""
    wanted = str(mnt_id)
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if not fields or fields[0] != wanted:
            continue
        try:
            return fields[fields.index("-", 6) + 1] or None
        except (ValueError, IndexError):
            return None
    return None


def fd_fs_type(fd: int) -> str | None:
    """The filesystem type of open descriptor ``fd`` (from its mount id), or None where the
    system does not say (no /proc, an older kernel without ``mnt_id``)."""
    try:
        with open(f"/proc/self/fdinfo/{fd}", "rb") as f:
            found = _MNT_ID.search(f.read())
        if found is None:
            return None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            return mount_fs_type(f.read(), int(found.group(1)))
    except OSError:
        return None
