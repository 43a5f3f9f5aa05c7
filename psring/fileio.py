"""Writing a run's output files so that a failure (a full disk above all) names its cause, leaves no
temporary file behind and never damages the complete file a previous write left.

Every file is written whole to ``NAME.tmpPID`` next to it and renamed over ``NAME``: a reader (and a run
killed at any moment) sees the old or the new file, never half of one. torch.save is serialized to
memory first: writing to a file itself, torch turns the OS's ENOSPC into an opaque
``RuntimeError: ... unexpected pos``, from which nothing can tell the user that the disk is full.
"""
from __future__ import annotations

import errno
import io
import os
import re
from pathlib import Path

# the errors a user fixes on the machine (free space, quota, permissions), not in psring
CAUSES = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
          errno.EROFS: "read-only file system", errno.EACCES: "permission denied", errno.EIO: "I/O error"}
TMP_RE = re.compile(r"\.tmp(\d+)$")
FULL_BELOW_BYTES = 64 << 10  # a file system with less free space than this cannot take a log line


class WriteError(RuntimeError):
    """An output file could not be written; the message names the cause and the file (one line)."""


def describe(e: OSError, path: str | Path | None = None) -> str:
    """``no space left on device writing runs/x/model.pt``: the cause in words, then the file."""
    cause = CAUSES.get(e.errno) or (e.strerror or str(e)).lower()
    where = path if path is not None else e.filename
    return f"{cause} writing {where}" if where else cause


def write_atomic(path: str | Path, data: bytes | bytearray | memoryview | str,
                 keep_previous: Path | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file and a rename; raise ``WriteError`` naming the
    cause, with the temporary file removed and any earlier ``path`` untouched. ``keep_previous``: the
    earlier ``path``, if any, is renamed there once the new one is complete."""
    path = Path(path)
    tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
    try:
        with open(tmp, "w" if isinstance(data, str) else "wb") as f:
            f.write(data)
        if keep_previous is not None and path.exists():
            os.replace(path, keep_previous)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise WriteError(describe(e, path)) from None
    except BaseException:  # interrupted: still no temporary file left behind
        tmp.unlink(missing_ok=True)
        raise
    return path


def torch_save_atomic(obj, path: str | Path, keep_previous: Path | None = None) -> Path:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return write_atomic(path, buf.getbuffer(), keep_previous)


def disk_full(path: str | Path) -> bool:
    """Whether the file system holding ``path`` (or its nearest existing parent) is out of space."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return False
    return st.f_bavail * st.f_frsize < FULL_BELOW_BYTES


def remove_temporaries(folders: list[Path], pids: set[int] | None = None) -> list[Path]:
    """Delete the ``*.tmpPID`` files in ``folders`` (not below them) written by the (dead) processes
    ``pids`` (None: by any process): a writer killed between writing and renaming leaves one."""
    removed = []
    for folder in folders:
        for f in Path(folder).glob("*.tmp*"):
            m = TMP_RE.search(f.name)
            if m and (pids is None or int(m.group(1)) in pids) and f.is_file():
                f.unlink(missing_ok=True)
                removed.append(f)
    return removed


def out_folder(path: str | Path, flag: str = "--out") -> Path:
    """Make the output folder ``path`` (and its parents); a path that is empty, a file, or cannot be made
    is one ``ConfigError`` line naming it and the cause, before anything is written."""
    from .options import ConfigError

    if not str(path).strip():
        raise ConfigError(f"{flag} is empty: give a folder")
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{flag} {path}: a file is in the way (it, or a folder above it); give a folder") from None
    except OSError as e:
        cause = CAUSES.get(e.errno) or (e.strerror or str(e)).lower()
        raise ConfigError(f"{flag} {path}: cannot make the folder ({cause})") from None
    return path


def read_toml(path: str | Path, what: str) -> dict:
    """A TOML file's document; a path that is no regular file (a folder, a pipe), unreadable, not UTF-8 or not
    TOML is one ``ConfigError`` line naming ``what`` and ``path``."""
    import tomllib

    from .options import ConfigError

    path = Path(path)
    try:
        if not path.is_file():
            raise ConfigError(f"cannot read {what} {path}: " + ("not a regular file" if path.exists() else "no such file"))
        return tomllib.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read {what} {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{what} {path} is not text (UTF-8): is it the TOML file?") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{what} {path} is not valid TOML: {e}") from None
