"""The converter never overwrites or corrupts its destination (issue 18, item 2).

Faults are injected where they would hit: the save raising (a full or read-only disk, Ctrl-C, a
bug), a real ``RLIMIT_FSIZE`` making safetensors fail, and real SIGKILLs, both of a conversion and
at every step of the folder swap in :mod:`hf_flashpatch.atomic_dir`. After each, the destination is
byte for byte what it was, or the complete new conversion, and no temporary folder is left once the
next run has cleaned up.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from real_model import require_smollm2
from test_convert import tiny_model
from transformers import AutoConfig, PreTrainedModel

from hf_flashpatch import atomic_dir as atomic_dir_module
from hf_flashpatch.atomic_dir import leftovers, recover
from hf_flashpatch.checkpoint_conversion import ConversionError, convert_checkpoint, main

REPO = Path(__file__).absolute().parents[1]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` by relative path, with the sha256 of its bytes."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}  # fmt: skip


def digests(files: dict[str, bytes]) -> dict[str, str]:
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def kv_heads(folder: Path) -> int:
    return AutoConfig.from_pretrained(folder).num_key_value_heads


@pytest.fixture
def converted(tmp_path):
    """``(src, dst, bytes of dst)``: a tiny Llama (4 KV heads) and a finished conversion of it to 2."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny_model("llama").save_pretrained(src)
    convert_checkpoint(str(src), str(dst), 2)
    return src, dst, snapshot(dst)


def one_error_line(err: str) -> str:
    """The one line the CLI printed about the failure (transformers' progress bars aside)."""
    lines = [line for line in err.splitlines() if "hf-flashpatch" in line or "rror" in line]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_refuses_a_non_empty_destination_unless_overwrite(tmp_path, capsys):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny_model("llama").save_pretrained(src)
    dst.mkdir()
    (dst / "config.json").write_text('{"the user\'s": "own file"}')
    with pytest.raises(ConversionError, match=rf"destination {dst}: folder is not empty \(config.json\); pass --overwr"):
        convert_checkpoint(str(src), str(dst), 2)
    assert main([str(src), str(dst), "--kv-heads", "2"]) == 2
    assert "pass --overwrite" in one_error_line(capsys.readouterr().err)
    assert snapshot(dst) == digests({"config.json": b'{"the user\'s": "own file"}'})

    assert main([str(src), str(dst), "--kv-heads", "2", "--overwrite"]) == 0
    assert kv_heads(dst) == 2 and json.loads((dst / "gqa_conversion.json").read_text())["kv_heads_after"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]  # old folder and temp folder gone

    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is not "someone's data": used without --overwrite
    convert_checkpoint(str(src), str(empty), 1)
    assert kv_heads(empty) == 1


def _broken_save(failure):
    def save_pretrained(self, folder, *args, **kwargs):  # half a checkpoint, then the failure
        Path(folder, "config.json").write_text('{"half": ')
        Path(folder, "model.safetensors").write_bytes(b"\0" * 4096)
        raise failure

    return save_pretrained


@pytest.mark.parametrize("failure, raised", [
    (OSError(errno.ENOSPC, "No space left on device"), ConversionError),
    (KeyboardInterrupt(), KeyboardInterrupt),
    (RuntimeError("a bug in the save"), RuntimeError),
], ids=["disk_full", "ctrl_c", "bug"])  # fmt: skip
def test_a_failed_overwrite_leaves_the_destination_as_it_was(converted, monkeypatch, failure, raised):
    src, dst, before = converted
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", _broken_save(failure))
    with pytest.raises(raised) as info:
        convert_checkpoint(str(src), str(dst), 1, overwrite=True)
    if raised is ConversionError:
        assert str(info.value).startswith(f"destination {dst}: cannot write: No space left on device")
    assert snapshot(dst) == before
    assert leftovers(dst) == []


@pytest.mark.parametrize("code, where", [(errno.ENOSPC, "save"), (errno.EROFS, "mkdir"), (errno.EACCES, "mkdir")],
                         ids=["ENOSPC", "EROFS", "EACCES"])
def test_cli_reports_a_full_or_read_only_disk_in_one_line(tmp_path, monkeypatch, capsys, code, where):
    src, dst = tmp_path / "src", tmp_path / "dst"
    tiny_model("llama").save_pretrained(src)
    if where == "save":
        monkeypatch.setattr(PreTrainedModel, "save_pretrained",
                            _broken_save(OSError(code, os.strerror(code), str(dst / "model.safetensors"))))  # fmt: skip
    else:  # the disk refuses any new folder in tmp_path, as a read-only or foreign one does
        real_mkdir = os.mkdir

        def mkdir(path, *args, **kwargs):
            if Path(path).parent == tmp_path:
                raise OSError(code, os.strerror(code), str(path))
            return real_mkdir(path, *args, **kwargs)

        monkeypatch.setattr(os, "mkdir", mkdir)
    assert main([str(src), str(dst), "--kv-heads", "2"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert line.startswith(f"hf-flashpatch convert: error: destination {dst}: cannot write: {os.strerror(code)}")
    assert "saved to" not in captured.out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_missing_source_or_a_file_as_destination_is_one_line(tmp_path, capsys):
    src = tmp_path / "src"
    tiny_model("llama").save_pretrained(src)
    (tmp_path / "notes.txt").write_text("mine")
    cases = [
        ([str(tmp_path / "missing"), str(tmp_path / "out")], f"source {tmp_path / 'missing'}: no such folder"),
        ([str(tmp_path / "notes.txt"), str(tmp_path / "out")], "is a file, expected a checkpoint folder"),
        ([str(tmp_path), str(tmp_path / "out")], "no config.json, not a transformers checkpoint folder"),
        ([str(src), str(tmp_path / "notes.txt")], f"destination {tmp_path / 'notes.txt'}: is a file"),
    ]
    for argv, message in cases:
        assert main([*argv, "--kv-heads", "2"]) == 2, argv
        assert message in one_error_line(capsys.readouterr().err)
        with pytest.raises(ConversionError, match="source|destination"):
            convert_checkpoint(argv[0], argv[1], 2, overwrite=True)  # the API: one exception type
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "src"]


def test_a_corrupt_source_is_named_as_the_source(converted, tmp_path, capsys):
    """A truncated weights file used to be reported as a write error of the destination."""
    src, dst, before = converted
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    assert main([str(src), str(dst), "--kv-heads", "2", "--overwrite"]) == 2
    assert f"source {src}: could not load" in one_error_line(capsys.readouterr().err)
    assert snapshot(dst) == before


def test_a_destination_nested_with_its_source_is_refused(converted, capsys):
    """Inside the source it would write into the checkpoint it reads; holding it, --overwrite would delete it."""
    src, dst, _ = converted
    source_files = snapshot(src)
    for target, message in ((src / "sub", "is inside the source"), (src.parent, "holds the source")):
        assert main([str(src), str(target), "--kv-heads", "2", "--overwrite"]) == 2
        assert message in one_error_line(capsys.readouterr().err)
    assert snapshot(src) == source_files and not (src / "sub").exists()


def _run_python(code: str, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True, text=True,
                          timeout=120, **kwargs)  # fmt: skip


def test_file_size_limit_hit_by_safetensors_is_one_line(converted):
    """A real write failure: past RLIMIT_FSIZE the kernel refuses writes (EFBIG, as a full disk
    refuses them with ENOSPC), and safetensors reports it as its own error type, not an OSError."""
    src, dst, before = converted
    proc = _run_python(f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
        resource.setrlimit(resource.RLIMIT_FSIZE, (50_000, 50_000))  # the weights are ~270 kB
        from hf_flashpatch.cli import main
        sys.exit(main(["convert", {str(src)!r}, {str(dst)!r}, "--kv-heads", "1", "--overwrite"]))
    """)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    last_line = proc.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"hf-flashpatch convert: error: destination {dst}: cannot write")
    assert "File too large" in proc.stderr
    assert snapshot(dst) == before and leftovers(dst) == []


def test_sigkill_during_a_reconversion_then_rerun(converted):
    src, dst, before = converted
    proc = _run_python(f"""
        import os, signal
        from transformers import PreTrainedModel
        from hf_flashpatch.checkpoint_conversion import convert_checkpoint
        save = PreTrainedModel.save_pretrained

        def save_then_die(self, *args, **kwargs):  # the weights written, tokenizer and record not yet
            save(self, *args, **kwargs)
            os.kill(os.getpid(), signal.SIGKILL)

        PreTrainedModel.save_pretrained = save_then_die
        convert_checkpoint({str(src)!r}, {str(dst)!r}, 1, overwrite=True)
    """)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert snapshot(dst) == before  # config and weights of one conversion, its own record
    (stale,) = leftovers(dst)
    assert ".tmp-" in stale.name and (stale / "model.safetensors").is_file()
    assert main([str(src), str(dst), "--kv-heads", "1", "--overwrite"]) == 0
    assert kv_heads(dst) == 1 and leftovers(dst) == []


# --------------------------------------------------------------------- atomic_dir on its own

_ATOMIC_DIR = REPO / "hf_flashpatch" / "atomic_dir.py"

# The child loads atomic_dir.py by path (no torch import: quick), writes a new version of ``dst`` over
# the old one and SIGKILLs itself at one step. ``os.rename`` and ``_exchange`` are wrapped to count steps.
_SWAP_CHILD = """
import importlib.util, os, signal, sys
spec = importlib.util.spec_from_file_location("atomic_dir", {module!r})
atomic_dir = importlib.util.module_from_spec(spec)
spec.loader.exec_module(atomic_dir)
point, dst = {point!r}, {dst!r}
die = lambda: os.kill(os.getpid(), signal.SIGKILL)

exchange = atomic_dir._exchange
if point in ("set_aside", "promoted"):
    atomic_dir._exchange = lambda a, b: False  # the fallback: move aside, promote, delete
else:
    atomic_dir._exchange = lambda a, b: exchange(a, b) and die()
rename, renames = os.rename, []
def counting_rename(a, b):
    rename(a, b)
    renames.append((a, b))
    if (point, len(renames)) in (("set_aside", 1), ("promoted", 2)):
        die()
os.rename = counting_rename

with atomic_dir.atomic_dir(dst, overwrite=True) as tmp:
    (tmp / "a.txt").write_text("new a")
    if point == "writing":
        die()
    (tmp / "b.txt").write_text("new b")
print("not killed")
"""

OLD = {"a.txt": b"old a", "b.txt": b"old b", "sub/c.txt": b"old c"}
NEW = {"a.txt": b"new a", "b.txt": b"new b"}
OLD_DIGESTS, NEW_DIGESTS = digests(OLD), digests(NEW)


@pytest.mark.parametrize("point, after_kill, after_recover", [
    ("writing", OLD_DIGESTS, OLD_DIGESTS),    # killed while the new folder is half written
    ("exchanged", NEW_DIGESTS, NEW_DIGESTS),  # swapped by one renameat2, killed before the old is deleted
    ("set_aside", None, OLD_DIGESTS),         # fallback, killed between "move old aside" and "promote new"
    ("promoted", NEW_DIGESTS, NEW_DIGESTS),   # fallback, killed before the old one is deleted
], ids=["writing", "exchanged", "set_aside", "promoted"])  # fmt: skip
def test_sigkill_at_each_step_of_the_swap(tmp_path, point, after_kill, after_recover):
    dst = tmp_path / "dst"
    for name, data in OLD.items():
        (dst / name).parent.mkdir(parents=True, exist_ok=True)
        (dst / name).write_bytes(data)
    proc = _run_python(_SWAP_CHILD.format(module=str(_ATOMIC_DIR), point=point, dst=str(dst)))
    assert proc.returncode == -signal.SIGKILL, proc.stdout + proc.stderr
    assert (snapshot(dst) if dst.exists() else None) == after_kill
    assert leftovers(dst)  # the dead run's temporary or set-aside folder
    recover(dst)  # what the next run does first
    assert snapshot(dst) == after_recover
    assert leftovers(dst) == []


def test_recover_leaves_a_live_writers_folder_alone(tmp_path):
    """A concurrent run's temporary folder is in use: only folders of dead processes are removed."""
    dst = tmp_path / "dst"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        live = tmp_path / f".dst.tmp-{atomic_dir_module._HOST}-{sleeper.pid}-abcd"
        live.mkdir()
        recover(dst)
        assert live.is_dir()
    finally:
        sleeper.kill()
        sleeper.wait()
    recover(dst)
    assert not live.exists()
    with atomic_dir_module.atomic_dir(dst) as tmp:  # and our own folder, mid-write, survives a recover()
        recover(dst)
        assert tmp.is_dir()
        (tmp / "x").write_text("x")
    assert snapshot(dst) == digests({"x": b"x"}) and leftovers(dst) == []


@pytest.mark.slow
def test_external_sigkill_while_reconverting_smollm2(tmp_path):
    """The issue's reproduction on the real model: re-converting SmolLM2 over a valid conversion and
    killed from outside while the weights are being written. The destination still loads as before."""
    require_smollm2()
    dst = tmp_path / "smollm2_mqa"
    assert main(["smollm2", str(dst), "--kv-heads", "3"]) == 0  # identity conversion: a valid DST
    before = snapshot(dst)
    child = subprocess.Popen([sys.executable, "-m", "hf_flashpatch.cli", "convert", "smollm2", str(dst),
                              "--kv-heads", "1", "--overwrite", "--calibration-tokens", "1024"], cwd=REPO,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 1800  # a hang guard, not a speed limit
        while not any((p / "model.safetensors").exists() for p in leftovers(dst)):
            assert child.poll() is None and time.monotonic() < deadline, "the conversion ended before the kill"
            time.sleep(0.01)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    assert snapshot(dst) == before and kv_heads(dst) == 3
    assert main(["smollm2", str(dst), "--kv-heads", "1", "--overwrite", "--calibration-tokens", "1024"]) == 0
    assert kv_heads(dst) == 1 and leftovers(dst) == []


def test_a_count_the_config_refuses_makes_no_folder_and_loads_no_model(tmp_path, monkeypatch):
    """The refusal came after the model load (30 s for SmolLM2), and the destination's parents were made first."""
    import hf_flashpatch.checkpoint_conversion as convert_module

    tiny_model("llama", heads=8, kv_heads=4).save_pretrained(tmp_path / "src")
    monkeypatch.setattr(convert_module, "_load_source", lambda *args: pytest.fail("the model was loaded"))
    with pytest.raises(ValueError, match=r"num_key_value_heads=3 must divide the current 4 KV heads"):
        convert_checkpoint(str(tmp_path / "src"), str(tmp_path / "new" / "deeper" / "out"), 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]
