"""A training run's resume point on disk, ``OUTPUT/checkpoint``, replaced so that no kill loses it.

A save writes ``checkpoint.tmp`` in full and fsyncs every file in it. It then writes ``COMPLETE``
last: a manifest of every file with its size. Only then does the swap start:

1. the old ``checkpoint`` is moved aside to ``checkpoint.old``;
2. ``checkpoint.tmp`` is renamed to ``checkpoint``;
3. ``checkpoint.old`` is deleted.

A folder counts as complete only when its manifest matches its files. A kill at any point
therefore leaves at least one complete checkpoint, and :func:`recover` finds the newest:

- ``checkpoint.tmp``, when complete: the newest, since every save deletes it first; it is promoted;
- else ``checkpoint``, when complete;
- else ``checkpoint.old``, when complete: the kill fell between steps 1 and 2; it is moved back.

Incomplete leftovers are deleted. Nothing complete is deleted before a newer complete checkpoint is
in place. Deleting a folder removes its manifest first, so a folder whose deletion was cut short
reads as incomplete.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from .atomic_dir import fsync_dir

CHECKPOINT = "checkpoint"
MANIFEST = "COMPLETE"
STATE_FILE = "trainer_state.json"

__all__ = ["CHECKPOINT", "MANIFEST", "STATE_FILE", "is_complete", "read_state", "recover", "save", "seal"]


def _paths(output: Path) -> tuple[Path, Path, Path]:
    """``(checkpoint, checkpoint.tmp, checkpoint.old)`` under ``output``."""
    return output / CHECKPOINT, output / (CHECKPOINT + ".tmp"), output / (CHECKPOINT + ".old")


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST)


def seal(folder: Path) -> None:
    """Fsync every file under ``folder``, then write its manifest: from now on it is complete."""
    files, sizes = _files(folder), {}
    for path in files:
        with open(path, "rb") as stream:
            os.fsync(stream.fileno())
        sizes[path.relative_to(folder).as_posix()] = path.stat().st_size
    for sub in (path for path in folder.rglob("*") if path.is_dir()):  # FSDP shards live in subfolders
        fsync_dir(sub)
    partial = folder / (MANIFEST + ".partial")
    with open(partial, "w", encoding="utf-8") as stream:
        json.dump({"files": sizes}, stream, indent=1)
        stream.flush()
        os.fsync(stream.fileno())
    os.replace(partial, folder / MANIFEST)  # a manifest is whole or absent
    fsync_dir(folder)


def is_complete(folder: Path) -> bool:
    """True when ``folder`` has a manifest and every file it lists exists with the listed size."""
    try:
        files = json.loads((folder / MANIFEST).read_text(encoding="utf-8"))["files"]
        return bool(files) and all((folder / name).stat().st_size == size for name, size in files.items())
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _remove(folder: Path) -> None:
    """Delete ``folder``; its manifest goes first, so a deletion cut short leaves an incomplete folder."""
    if not folder.exists():
        return
    (folder / MANIFEST).unlink(missing_ok=True)
    fsync_dir(folder)
    shutil.rmtree(folder)


def _promote(output: Path) -> None:
    """Swap the complete ``checkpoint.tmp`` in; the checkpoint it replaces is deleted only afterwards."""
    final, tmp, old = _paths(output)
    if final.exists():
        # checkpoint.old is never newer than checkpoint (it is a former checkpoint), and tmp is
        # complete: nothing is lost by deleting it.
        _remove(old)
        os.replace(final, old)
        fsync_dir(output)
    os.replace(tmp, final)
    fsync_dir(output)
    _remove(old)


def recover(output) -> Path | None:
    """Leave ``output`` with its newest complete checkpoint as ``checkpoint/`` and return it, or None.

    Incomplete ``checkpoint.tmp``/``checkpoint.old`` leftovers are deleted. An incomplete
    ``checkpoint/`` is deleted only when a complete one replaces it; otherwise it stays for the caller
    to report (no new save ever leaves one, but an older version of this package did).
    Call it on one process only.
    """
    output = Path(output)
    final, tmp, old = _paths(output)
    if is_complete(tmp):
        _promote(output)
    elif is_complete(final):
        _remove(tmp)
        _remove(old)
    elif is_complete(old):
        _remove(tmp)
        _remove(final)
        os.replace(old, final)
        fsync_dir(output)
    else:
        _remove(tmp)
        _remove(old)
    return final if is_complete(final) else None


def read_state(folder: Path) -> dict:
    """The trainer state a save stored beside accelerate's files."""
    return json.loads((Path(folder) / STATE_FILE).read_text(encoding="utf-8"))


def save(accelerator, output, state: dict) -> Path:
    """Save accelerate's state and ``state`` (JSON) as the new ``output/checkpoint``, crash-safely.

    Every process calls it (accelerate writes per-process RNG files); the main process seals and
    swaps. Returns the checkpoint folder.
    """
    output = Path(output)
    final, tmp, _ = _paths(output)
    if accelerator.is_main_process:
        _remove(tmp)  # never complete here: recover() promoted any complete one before training began
    accelerator.wait_for_everyone()
    accelerator.save_state(str(tmp))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        (tmp / STATE_FILE).write_text(json.dumps(state, indent=1), encoding="utf-8")
        seal(tmp)
        _promote(output)
    accelerator.wait_for_everyone()
    return final
