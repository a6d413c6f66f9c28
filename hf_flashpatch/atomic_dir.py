"""Write a folder so that, killed at any point, its destination is either as it was or complete.

    with atomic_dir("out/model", overwrite=True) as tmp:   # tmp: an empty folder beside out/model
        model.save_pretrained(tmp)                           # an exception here: tmp removed, DST untouched
    # here out/model is the new folder, whole

The writer fills a temporary folder beside the destination (same filesystem, so ``rename`` is
atomic), its files are fsync-ed, and only then is it renamed into place:

- a missing or empty destination is replaced by one ``rename`` (POSIX lets a directory replace an
  empty one; a destination that filled up meanwhile makes it fail instead of being clobbered);
- a non-empty destination (only with ``overwrite=True``) is swapped in one step where Linux offers
  ``renameat2(RENAME_EXCHANGE)``, and the old contents, now under the temporary name, are deleted.
  Elsewhere the old folder is moved aside, the new one promoted, the old one deleted last.

A kill leaves at most a temporary (``.NAME.tmp-…``) or set-aside (``.NAME.old-…``) folder beside the
destination, named after the host and process that made it. :func:`recover` (run on entry, and
callable by readers, e.g. before resuming from a checkpoint) removes those whose process is dead,
and moves a set-aside folder back when the kill fell between the two renames of the fallback swap.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import os
import re
import secrets
import shutil
import socket
from contextlib import contextmanager
from pathlib import Path

# Names carry the owner so that a later run can tell a dead run's leftovers from a live writer's.
_HOST = hashlib.sha1(socket.gethostname().encode()).hexdigest()[:8]
_LEFTOVER = re.compile(r"\.(tmp|old)-([0-9a-f]{8})-(\d+)-[0-9a-f]+")


def _sibling(dst: Path, kind: str) -> Path:
    return dst.parent / f".{dst.name}.{kind}-{_HOST}-{os.getpid()}-{secrets.token_hex(4)}"


def _owner_is_dead(host: str, pid: int) -> bool:
    """True only when sure: same host and no such process (another host's folders are left alone)."""
    if host != _HOST or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return False


def _parse(dst: Path, path: Path):
    """``(kind, host, pid)`` of a leftover's name (kind "tmp" or "old"), or None for any other name."""
    prefix = f".{dst.name}"
    match = _LEFTOVER.fullmatch(path.name[len(prefix):]) if path.name.startswith(prefix) else None
    return (match.group(1), match.group(2), int(match.group(3))) if match else None


def leftovers(dst) -> list[Path]:
    """The temporary and set-aside folders beside ``dst`` (any owner, dead or alive)."""
    dst = Path(dst)
    if not dst.parent.is_dir():
        return []
    return sorted(p for p in dst.parent.iterdir() if _parse(dst, p))


def recover(dst) -> None:
    """Clean up after runs killed while writing ``dst``: restore or delete what they left beside it.
    Folders of live processes (a concurrent writer) and of other hosts are left alone."""
    dst = Path(dst)
    dead = [(path, _parse(dst, path)[0]) for path in leftovers(dst) if _owner_is_dead(*_parse(dst, path)[1:])]
    # Set-aside folders first, newest first: if dst is missing, the newest old folder is what it was.
    dead.sort(key=lambda item: (item[1] != "old", -item[0].stat().st_mtime))
    for path, kind in dead:
        if kind == "old" and not os.path.lexists(dst):
            os.rename(path, dst)  # killed between "move aside" and "promote": the old folder is still whole
        else:
            shutil.rmtree(path, ignore_errors=True)


def _is_empty_dir(path: Path) -> bool:
    with os.scandir(path) as entries:
        return next(entries, None) is None


def _fsync_tree(root: Path) -> None:
    """Flush every file and folder under ``root`` to disk, so a power cut after the rename cannot
    leave a promoted folder of empty files (a process kill alone would not need it)."""
    for folder, _, files in os.walk(root):
        for name in files:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fsync_dir(Path(folder))


def fsync_dir(folder: Path) -> None:
    """Make a rename or a new entry in ``folder`` durable (the entry lives in the directory, not the file)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap ``a`` and ``b`` atomically (Linux ``renameat2``); False where the OS or filesystem cannot."""
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # not glibc >= 2.28 (macOS, musl, ...)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    # EINVAL: a filesystem without it (NFS, older overlayfs); ENOSYS: an old kernel; EPERM: a seccomp
    # filter that blocks the syscall (some container runtimes). Plain renames work in all three.
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.EPERM):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _promote(tmp: Path, dst: Path) -> None:
    """Put the finished ``tmp`` at ``dst``; killed anywhere, ``dst`` is old-and-whole or new-and-whole
    (or, in the fallback's one-syscall gap, missing with the old folder set aside for :func:`recover`)."""
    if not dst.exists() or _is_empty_dir(dst):
        os.rename(tmp, dst)  # fails with ENOTEMPTY/EEXIST if dst filled up since the check
        return
    # Deleting the old contents is housekeeping: dst is already whole, so a failure there must not
    # fail the write; what is left carries our pid and goes at the next recover().
    if _exchange(tmp, dst):
        shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the old contents
        return
    aside = _sibling(dst, "old")
    os.rename(dst, aside)
    try:
        os.rename(tmp, dst)
    except BaseException:
        os.rename(aside, dst)  # put the old one back: recover() would not, as its owner (we) is alive
        raise
    shutil.rmtree(aside, ignore_errors=True)


def check_destination(dst, *, overwrite: bool = False) -> Path:
    """Raise before any work if ``dst`` cannot be written: ``NotADirectoryError`` if it is a file,
    ``FileExistsError`` if it is a non-empty folder and ``overwrite`` is false. Returns ``dst``
    (a symlink resolved: the folder it points to is the one replaced)."""
    dst = Path(dst)
    if dst.is_symlink():
        dst = dst.resolve()
    if dst.exists() and not dst.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, "exists and is not a folder", str(dst))
    if dst.is_dir() and not overwrite and not _is_empty_dir(dst):
        raise FileExistsError(errno.ENOTEMPTY, "folder exists and is not empty", str(dst))
    return dst


@contextmanager
def atomic_dir(dst, *, overwrite: bool = False):
    """Yield an empty temporary folder beside ``dst``; on a clean exit it replaces ``dst`` atomically.

    On any exception (``KeyboardInterrupt`` included) the temporary folder is removed and ``dst`` is
    left as it was. Raises as :func:`check_destination`; ``OSError`` from the filesystem passes through.
    """
    dst = check_destination(dst, overwrite=overwrite)
    dst.parent.mkdir(parents=True, exist_ok=True)
    recover(dst)
    tmp = _sibling(dst, "tmp")
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if not overwrite:  # the check again: something may have been written there meanwhile
            check_destination(dst)
        _promote(tmp, dst)
        fsync_dir(dst.parent)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already after a successful promote
