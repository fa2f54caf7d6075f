"""A value in a rule file that is a secret (a token in a request header): written as a
reference, ``{from_file: PATH}`` or ``{from_env: NAME}``, so that the rule file, and the
copy of it the daemon keeps, never holds the secret itself.  The secret is read when the
plugin needs it and never shown."""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, model_validator

#: a secret file longer than this is not a token
MAX_SECRET_BYTES = 64 * 1024


class SecretRef(BaseModel):
    """``{from_file: PATH}`` (the file's text, without its trailing line break) or
    ``{from_env: NAME}`` (that variable of the daemon's environment)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    from_file: str | None = Field(None, description="an absolute path to a file holding the secret")
    from_env: str | None = Field(None, min_length=1, description="the daemon's environment variable holding it")

    @model_validator(mode="after")
    def _one(self) -> SecretRef:
        if (self.from_file is None) == (self.from_env is None):
            raise ValueError("a secret reference names either from_file or from_env")
        if self.from_file is not None and not os.path.isabs(self.from_file):
            raise ValueError(f"from_file must be an absolute path (got {self.from_file!r})")
        return self

    def value(self) -> str:
        """The secret; ``ValueError`` says why it cannot be had (never what it is)."""
        if self.from_env is not None:
            found = os.environ.get(self.from_env)
            if found is None:
                raise ValueError(f"the environment variable {self.from_env} is not set in the daemon's environment")
            return found
        assert self.from_file is not None
        try:
            # non-blocking, checked on the descriptor: a FIFO there must not hang the caller
            fd = os.open(self.from_file, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | getattr(os, "O_NOCTTY", 0))
        except OSError as exc:
            raise ValueError(f"cannot read the secret file {self.from_file}: {exc.strerror or exc}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise ValueError(f"the secret file {self.from_file} is not a regular file")
            if st.st_size > MAX_SECRET_BYTES:
                raise ValueError(f"the secret file {self.from_file} is over {MAX_SECRET_BYTES} bytes: not a token")
            data = os.read(fd, MAX_SECRET_BYTES + 1)
        finally:
            os.close(fd)
        return data.decode("utf-8", "replace").rstrip("\r\n")


def secret_values(values: Mapping[str, str | SecretRef]) -> dict[str, str]:
    """``values`` with each reference replaced by its secret (``ValueError`` as :meth:`SecretRef.value`)."""
    return {k: v.value() if isinstance(v, SecretRef) else v for k, v in values.items()}
