"""What a training run leaves in ``OUTPUT`` besides its resume point: ``final/`` and ``report.json``.

- ``final/`` (the trained model and tokenizer) is written through :func:`~hf_flashpatch.atomic_dir.atomic_dir`:
  a kill at any point leaves the previous ``final/`` or the whole new one, never a mix of old and new shards
  or weights without their tokenizer.
- ``report.json`` is replaced by one rename, after ``final/``: a report that says the run finished always
  sits beside that run's whole model.
- A run that starts over (``--no-resume``) moves a previous run's ``final/`` and ``report.json`` into
  ``OUTPUT/previous_run/`` (replacing an older one there) before it trains, so the folder never passes the old
  results off as the new run's and nothing finished is deleted by the restart itself.
- A write that fails for lack of space (or any OS error) raises :class:`TrainingOutputError` naming the
  path, the free space, and that the last complete checkpoint is kept (:mod:`hf_flashpatch.checkpointing`).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from .atomic_dir import atomic_dir, fsync_dir

FINAL = "final"
REPORT = "report.json"
PREVIOUS = "previous_run"

# torch.save reports a full disk as a RuntimeError of its zip writer, not as an OSError with ENOSPC.
_TORCH_WRITE_FAILURES = ("unexpected pos", "PytorchStreamWriter failed", "file write failed")
_LOW_SPACE_BYTES = 64 * 2**20


class TrainingOutputError(OSError):
    """The run could not write to its output folder; the message names the path and the reason. The scripts
    print it as one line (exit status 2); the last complete checkpoint is untouched and a rerun resumes."""


def _free_bytes(path: Path) -> int:
    for folder in (path, *path.parents):
        if folder.exists():
            return shutil.disk_usage(folder).free
    return 0


def _write_failure(error: BaseException, path: Path) -> TrainingOutputError | None:
    """The one-line error for a failed write to ``path``, or None when ``error`` is not one."""
    free = _free_bytes(path)
    message = str(error)
    full = getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "os error 28" in message or (
        any(sign in message for sign in _TORCH_WRITE_FAILURES) and free < _LOW_SPACE_BYTES)
    if full:
        reason = f"no space left on the device ({free / 2**20:.0f} MiB free)"
    elif isinstance(error, OSError):
        reason = error.strerror or message
    else:
        return None
    return TrainingOutputError(f"cannot write {path}: {reason}; the last complete checkpoint in {path.parent} is "
                               "kept: make room and rerun to resume")


@contextmanager
def writing(path):
    """Turn a failed write to ``path`` into :class:`TrainingOutputError` (other errors pass unchanged)."""
    try:
        yield
    except TrainingOutputError:
        raise
    except Exception as error:  # noqa: BLE001 - classified below, re-raised when it is no write failure
        explained = _write_failure(error, Path(path))
        if explained is None:
            raise
        raise explained from error


def write_json(path, value) -> None:
    """``value`` as JSON at ``path``, replaced by one rename: readers see the old file or the whole new one."""
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    with writing(path):
        with open(partial, "w", encoding="utf-8") as stream:
            json.dump(value, stream, indent=1)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, path)
        fsync_dir(path.parent)


def save_final(accelerator, model, tokenizer, output, report: dict) -> None:
    """Write ``OUTPUT/final`` (model and tokenizer) whole, then ``OUTPUT/report.json``. Every process calls it:
    the full state dict is gathered on all of them (FSDP), the main process writes."""
    output = Path(output)
    state_dict = accelerator.get_state_dict(model)
    unwrapped = accelerator.unwrap_model(model)
    unwrapped.config.use_cache = True
    if accelerator.is_main_process:
        with writing(output / FINAL), atomic_dir(output / FINAL, overwrite=True) as tmp:
            unwrapped.save_pretrained(tmp, save_function=accelerator.save, state_dict=state_dict)
            tokenizer.save_pretrained(tmp)
        write_json(output / REPORT, report)
    accelerator.wait_for_everyone()


def set_aside_previous_run(output) -> list[str]:
    """Move a previous run's ``final/`` and ``report.json`` into ``OUTPUT/previous_run/`` (an older one there is
    deleted first); returns what moved. Call it on the main process when a run starts over."""
    output = Path(output)
    present = [name for name in (FINAL, REPORT) if (output / name).exists()]
    if not present:
        return []
    previous = output / PREVIOUS
    with writing(previous):
        if previous.exists():
            shutil.rmtree(previous)
        previous.mkdir()
        for name in present:
            os.replace(output / name, previous / name)
        fsync_dir(previous)
        fsync_dir(output)
    return present
