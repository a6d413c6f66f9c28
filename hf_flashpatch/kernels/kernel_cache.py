"""The on-disk cubin cache: entries that are validated on every load, written atomically and durably,
readable by other users, with the leftovers of killed writers cleaned up.

- **Entry.** One file ``<source stem>-<key>.entry``: a header line
  ``hf_flashpatch-cubin <format> <size> <sha256>\\n`` and then the cubin. One file rather than a cubin
  plus a sidecar, so that one ``os.replace`` publishes bytes and checksum together: a reader sees the
  old entry or the new one, never a cubin with another writer's checksum. A truncated, empty, garbled
  or foreign file fails :func:`load` with the reason, and the caller recompiles and replaces it.
- **Write.** A temporary file in the entry's directory, created with mode 0644 less the umask (0644
  under the usual 022; a user whose umask is 077 keeps a private cache), ``fsync``-ed, then
  ``os.replace``-d onto the entry (atomic), then the directory is ``fsync``-ed. Directories are made
  with the default 0777 less the umask.
- **Leftovers.** Temporary names carry a host tag and the writer's pid
  (``.<entry>.<host>.<pid>.<token>.tmp``; nvcc's work directories ``hf_flashpatch-nvcc-<host>-<pid>-*``
  in the system temp dir), so :func:`remove_stale` can tell a dead writer's file from a live one's.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import shutil
import socket
import time
from pathlib import Path

MAGIC = b"hf_flashpatch-cubin"
FORMAT = 1  # bump when the entry layout changes (it is part of the cache key too)
ENTRY_SUFFIX = ".entry"
# A leftover whose writer we cannot check (another host, or a pid that may have been reused) is
# removed once it is this old. Entry temporaries live milliseconds; nvcc work dirs live one compile.
STALE_SECONDS = 30 * 60

TEMP_RE = re.compile(r"^\..+\.(?P<host>[0-9a-f]{8})\.(?P<pid>\d+)\.[0-9a-f]{8}\.tmp$")
WORKDIR_PREFIX = "hf_flashpatch-nvcc-"
WORKDIR_RE = re.compile(rf"^{WORKDIR_PREFIX}(?P<host>[0-9a-f]{{8}})-(?P<pid>\d+)-[a-z0-9_]+$")
# Versions up to 0.1.0 wrote mkstemp names with no pid in them: only their age tells them stale.
LEGACY_TEMP_RE = re.compile(r"^tmp[a-z0-9_]+\.cubin\.tmp$")


def host_tag() -> str:
    """8 hex digits naming this host in temp names (pids are only comparable on the same host)."""
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


def workdir_prefix() -> str:
    """``tempfile.mkdtemp`` prefix for one nvcc run's output directory (see :data:`WORKDIR_RE`)."""
    return f"{WORKDIR_PREFIX}{host_tag()}-{os.getpid()}-"


def check_cubin(data: bytes) -> str | None:
    """Why ``data`` is not a cubin, or None. A cubin is an ELF file, so the check is its magic."""
    if not data:
        return "it is empty (0 bytes)"
    if data[:4] != b"\x7fELF":
        return f"it does not start with the ELF magic (got {data[:4]!r}, {len(data)} bytes)"
    return None


def encode(cubin: bytes) -> bytes:
    return b"%s %d %d %s\n" % (MAGIC, FORMAT, len(cubin), hashlib.sha256(cubin).hexdigest().encode()) + cubin


def decode(blob: bytes) -> tuple[bytes | None, str]:
    """``(cubin, "")`` for a valid entry's bytes, else ``(None, why it is not valid)``."""
    if not blob:
        return None, "the file is empty (0 bytes)"
    header, newline, cubin = blob.partition(b"\n")
    fields = header.split(b" ") if newline and len(header) <= 128 else []
    if len(fields) != 4 or fields[0] != MAGIC:
        return None, f"it has no {MAGIC.decode()} header (starts with {blob[:20]!r}, {len(blob)} bytes)"
    if fields[1] != b"%d" % FORMAT:
        return None, f"it has format {fields[1].decode(errors='replace')!r}, this version reads {FORMAT}"
    try:
        size, digest = int(fields[2]), fields[3].decode("ascii")
    except ValueError:
        return None, f"its header is garbled ({header!r})"
    if len(cubin) != size:
        return None, f"it holds {len(cubin)} cubin bytes where its header says {size} (truncated?)"
    if hashlib.sha256(cubin).hexdigest() != digest:
        return None, "its sha256 does not match its header (corrupted)"
    why = check_cubin(cubin)
    return (None, f"its payload is not a cubin: {why}") if why else (cubin, "")


def load(path: Path) -> tuple[bytes | None, str]:
    """``(cubin, "")`` if ``path`` holds a valid entry, else ``(None, why not)`` (missing included)."""
    try:
        blob = path.read_bytes()
    except FileNotFoundError:
        return None, "missing"
    except OSError as exc:  # unreadable (another user's 0600 entry, I/O error): recompile, try to replace
        return None, f"unreadable ({type(exc).__name__}: {exc.strerror or exc})"
    return decode(blob)


def store(path: Path, cubin: bytes) -> None:
    """Publish ``cubin`` as the entry ``path``: atomic (concurrent writers leave one whole entry) and
    durable (data on disk before the rename makes it visible). Raises OSError (read-only, full disk)
    with nothing left behind."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{host_tag()}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)  # the umask applies: 0644 under 022
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(encode(cubin))
            file.flush()
            os.fsync(file.fileno())  # else a crash after the rename can leave a named but empty entry
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    """Make the rename itself durable; best effort (some filesystems refuse to fsync a directory)."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _pid_alive(pid: int) -> bool:
    if os.name == "nt":  # os.kill there terminates the process: assume alive, the age rule decides
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # PermissionError: alive, another user's
        return True
    return True


def is_stale(name: str, mtime: float, pattern: re.Pattern, now: float | None = None) -> bool:
    """Whether a leftover named ``name`` (matching ``pattern``) belongs to no live writer: its writer
    was on this host and is dead, or it is older than :data:`STALE_SECONDS`."""
    match = pattern.match(name)
    if match is None:
        return False
    if (time.time() if now is None else now) - mtime > STALE_SECONDS:
        return True
    groups = match.groupdict()
    if groups.get("host") != host_tag():
        return False
    pid = int(groups["pid"])
    return pid > 0 and not _pid_alive(pid)


def remove_stale(directory: Path, pattern: re.Pattern) -> list[str]:
    """Remove the stale leftovers (files or directories) in ``directory``; best effort, returns the
    names removed. Never touches a name that ``pattern`` does not match."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for entry in entries:
        try:
            if not is_stale(entry.name, entry.stat(follow_symlinks=False).st_mtime, pattern):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
            removed.append(entry.name)
        except OSError:  # gone meanwhile (another cleaner), or not ours to remove
            continue
    return removed
