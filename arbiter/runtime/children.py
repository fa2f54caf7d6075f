"""Every process arbiter starts for itself (probes, the reflex process, the plot drawer, a
plugin's tool) is started here, and only here.

The daemon may run as root in any folder: a child that read its working folder would run
whatever another account left there with root's rights (a folder named ``arbiter`` in the
working folder is imported before the installed one).  So a child starts in ``/``, with the
file mode mask :data:`UMASK`; a
Python child never puts a working or script folder on its path (``-P``) nor a user's site
folder (``-s``); its environment is chosen here: the daemon's own, where of the ``PYTHON*``
variables only ``PYTHONPATH`` is kept, with its absolute folders alone (the daemon's plugins
may live there; an empty or relative entry would mean the working folder).  Descriptors are
never inherited.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import Any

#: where every child starts: a folder no unprivileged account can write
CHILD_CWD = "/"
#: the file mode mask of the daemon and of every child: whatever mask it was started with
#: (0000 leaves what it makes writable by everyone), no file of arbiter's is writable by
#: another account unless it says so itself
UMASK = 0o022


def python_module(module: str, *args: str) -> list[str]:
    """The command line running ``python -m module args`` with neither the working folder
    nor a user's site folder on its path."""
    return [sys.executable, "-s", "-P", "-m", module, *args]


def python_script(path: str, *args: str) -> list[str]:
    """A script file of the standard library alone, fully isolated (``-I``: no ``PYTHON*``
    variable counts) and without the ``site`` module."""
    return [sys.executable, "-I", "-S", path, *args]


def child_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """``base`` (the daemon's environment unless given) without ``PYTHON*`` variables but
    the absolute folders of ``PYTHONPATH``, plus ``extra``."""
    source = os.environ if base is None else base
    env = {k: v for k, v in source.items() if not k.startswith("PYTHON")}
    path = [p for p in source.get("PYTHONPATH", "").split(os.pathsep) if os.path.isabs(p)]
    if path:
        env["PYTHONPATH"] = os.pathsep.join(path)
    env.update(extra or {})
    return env


def _options(kwargs: dict[str, Any], env: Mapping[str, str] | None, extra_env: Mapping[str, str] | None) -> None:
    for fixed in ("cwd", "shell", "preexec_fn", "umask"):
        if fixed in kwargs:
            raise TypeError(f"a child's {fixed} is chosen by arbiter.runtime.children, not by its caller")
    kwargs["cwd"] = CHILD_CWD
    kwargs["close_fds"] = True
    kwargs["umask"] = UMASK
    kwargs["env"] = child_env(extra_env, env)


def start_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.Popen[Any]:
    """``subprocess.Popen(argv, **kwargs)`` in ``/``, with :func:`child_env` (of ``env``, the
    daemon's environment unless given, plus ``extra_env``) and no inherited descriptors."""
    _options(kwargs, env, extra_env)
    return subprocess.Popen(list(argv), **kwargs)


def run_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    extra_env: Mapping[str, str] | None = None,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(argv, **kwargs)`` started as :func:`start_child` starts one."""
    _options(kwargs, env, extra_env)
    return subprocess.run(list(argv), **kwargs)  # noqa: PLW1510 - check is the caller's to give
