"""The kernel cache under injected faults: a broken nvcc, corrupt entries, an unwritable cache, killed
compiles, shared permissions and the cache key. nvcc runs for real on the small selftest kernel
(~0.4 s a compile); the faults are a fake nvcc script, a monkeypatched call, or a SIGKILL."""

import errno
import os
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
import warnings

import pytest
import torch

import hf_flashpatch
from hf_flashpatch import api
from hf_flashpatch.errors import KernelUnsupported
from hf_flashpatch.kernels import build, kernel_cache

needs_nvcc = pytest.mark.skipif(build.find_nvcc() is None, reason="nvcc not found")
SPEC = build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "7"),))


@pytest.fixture
def dirs(tmp_path, monkeypatch):
    """A fresh cache dir (not yet created), a private system temp dir, and no warnings remembered."""
    cache, systmp = tmp_path / "cache", tmp_path / "systmp"
    systmp.mkdir()
    monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(cache))
    monkeypatch.setattr(tempfile, "tempdir", str(systmp))
    monkeypatch.setattr(build, "_warned", set(), raising=False)
    return cache, systmp


def _files(directory):
    return sorted(os.listdir(directory)) if directory.exists() else []


def _fake_nvcc(tmp_path, monkeypatch, body, version="echo 'Cuda compilation tools, fake'; exit 0"):
    """Put a shell-script nvcc first (CUDA_HOME). ``body`` runs for a compile, with ``$out`` the -o path;
    every compile appends a line to ``calls``."""
    bin_dir = tmp_path / "fake_cuda" / "bin"
    bin_dir.mkdir(parents=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        if [ "$1" = "--version" ]; then {version}; fi
        echo compile >> "{tmp_path / 'calls'}"
        out=""; prev=""
        for a in "$@"; do if [ "$prev" = "-o" ]; then out="$a"; fi; prev="$a"; done
        {body}
    """))
    nvcc.chmod(0o755)
    monkeypatch.setenv("CUDA_HOME", str(tmp_path / "fake_cuda"))
    return nvcc


def _calls(tmp_path):
    path = tmp_path / "calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


# ------------------------------------------------------------------------ nvcc failures never leak


@pytest.mark.parametrize(
    "body,match",
    [
        ("exit 0", "exited 0 but wrote no cubin"),
        (': > "$out"; exit 0', "is no cubin: it is empty"),
        ("printf 'not a cubin' > \"$out\"; exit 0", "is no cubin: it does not start with the ELF magic"),
        ("echo 'fatal: injected' >&2; exit 2", "(?s)nvcc failed .*exit 2.*injected"),
    ],
    ids=["writes-nothing", "writes-zero-bytes", "writes-garbage", "exits-nonzero"],
)
def test_bad_nvcc_output_raises_kernel_unsupported_and_caches_nothing(dirs, tmp_path, monkeypatch, body, match):
    cache, systmp = dirs
    _fake_nvcc(tmp_path, monkeypatch, body)
    for _ in range(2):  # and the second call does not find a poisoned entry: it runs nvcc again
        with pytest.raises(KernelUnsupported, match=match):
            build.compile_cubin(SPEC)
    assert _calls(tmp_path) == 2
    assert _files(cache) == [] and _files(systmp) == []  # no entry, no temp, no nvcc work dir


@pytest.mark.parametrize(
    "version",
    ["echo 'libcudart missing' >&2; exit 1", "exit 0"],
    ids=["version-exits-nonzero", "version-prints-nothing"],
)
def test_nvcc_that_does_not_run_raises_kernel_unsupported(dirs, tmp_path, monkeypatch, version):
    _fake_nvcc(tmp_path, monkeypatch, "exit 0", version=version)
    with pytest.raises(KernelUnsupported, match="does not run"):
        build.compile_cubin(SPEC)


def test_nvcc_that_is_not_executable_raises_kernel_unsupported(dirs, tmp_path, monkeypatch):
    _fake_nvcc(tmp_path, monkeypatch, "exit 0").chmod(0o644)  # found (a file) but exec fails
    with pytest.raises(KernelUnsupported, match="does not run .*PermissionError"):
        build.compile_cubin(SPEC)


@needs_nvcc
def test_nvcc_that_cannot_start_raises_kernel_unsupported(dirs, monkeypatch):
    real_run = subprocess.run

    def run(cmd, *args, **kwargs):
        if "-cubin" in cmd:
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", cmd[0])  # nvcc vanished
        return real_run(cmd, *args, **kwargs)

    monkeypatch.setattr(build.subprocess, "run", run)
    with pytest.raises(KernelUnsupported, match="did not start .*FileNotFoundError"):
        build.compile_cubin(SPEC)


@needs_nvcc
def test_no_temp_dir_for_nvcc_raises_kernel_unsupported(dirs, monkeypatch):
    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "mkdtemp", no_space)
    monkeypatch.setattr(tempfile, "mkstemp", no_space)
    with pytest.raises(KernelUnsupported, match="no temp dir .*No space left"):
        build.compile_cubin(SPEC)


def test_public_api_takes_the_fallback_with_one_warning_and_one_nvcc_run(dirs, tmp_path, monkeypatch):
    """The path a user sees: ``api._kernel_call`` catches KernelUnsupported, warns once and returns None
    (the fallback); a kernel that failed is not recompiled on every call."""
    _fake_nvcc(tmp_path, monkeypatch, "echo 'fatal: injected' >&2; exit 1")
    monkeypatch.setattr(api, "kernels_unavailable_reason", lambda q: None)  # as on a GPU with a toolchain
    monkeypatch.setattr(api, "_warned", set())
    monkeypatch.setattr(build, "_kernels", {})
    monkeypatch.setattr(build, "_failed", {}, raising=False)
    q = torch.zeros(1)
    launch = lambda: build.get_kernel(SPEC, "selftest_axpy", torch.device("cuda", 0))  # noqa: E731
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert api._kernel_call(q, launch) is None
        assert api._kernel_call(q, launch) is None
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert "nvcc failed for selftest.cu" in str(caught[0].message) and "injected" in str(caught[0].message)
    assert _calls(tmp_path) == 1


def test_driver_that_cannot_load_the_cubin_raises_kernel_unsupported(monkeypatch):
    class FakeDriver:
        class Error(Exception):
            pass

        @classmethod
        def module_from_buffer(cls, cubin):
            raise cls.Error("cuModuleLoadDataEx failed: the provided PTX was compiled with an unsupported toolchain")

    class NoContext:
        def __init__(self, index):
            pass

        def __enter__(self):
            pass

        def __exit__(self, *exc):
            pass

    monkeypatch.setattr(build, "compile_cubin", lambda b: (b"\x7fELF", ""))
    monkeypatch.setattr(build, "_pycuda", lambda: FakeDriver)
    monkeypatch.setattr(build, "_InContext", NoContext)
    with pytest.raises(KernelUnsupported, match="cannot load selftest.cu .*unsupported toolchain"):
        build.Kernel(SPEC, "selftest_axpy", 0)


# ------------------------------------------------------------------------------ corrupt entries


def _truncate(blob):
    return blob[: len(blob) // 2]


def _flip_last_byte(blob):
    return blob[:-1] + bytes([blob[-1] ^ 0xFF])


@needs_nvcc
@pytest.mark.parametrize(
    "corrupt",
    [_truncate, lambda b: b"", lambda b: os.urandom(len(b)), _flip_last_byte, lambda b: b"\x7fELF" + b[4:100]],
    ids=["truncated", "zero-bytes", "garbage-same-size", "one-byte-flipped", "bare-elf-prefix"],
)
def test_corrupt_entry_is_recompiled_and_replaced(dirs, monkeypatch, corrupt, caplog):
    cache, _ = dirs
    good, _ = build.compile_cubin(SPEC)
    (entry,) = _files(cache)
    path = cache / entry
    path.write_bytes(corrupt(path.read_bytes()))
    again, _ = build.compile_cubin(SPEC)
    assert again == good
    assert _files(cache) == [entry]  # replaced in place, nothing else left
    assert "invalid" in caplog.text and str(path) in caplog.text

    def no_nvcc(*args, **kwargs):
        raise AssertionError("nvcc ran although the repaired entry is valid")

    monkeypatch.setattr(build, "_run_nvcc", no_nvcc, raising=False)
    monkeypatch.setattr(build.subprocess, "run", no_nvcc)
    assert build.compile_cubin(SPEC)[0] == good  # served from the repaired entry


def test_entry_format_round_trips_and_names_what_is_wrong():
    cubin = b"\x7fELF" + bytes(range(256)) * 3
    blob = kernel_cache.encode(cubin)
    assert kernel_cache.decode(blob) == (cubin, "")
    assert "truncated" in kernel_cache.decode(blob[:-10])[1]
    assert "sha256" in kernel_cache.decode(_flip_last_byte(blob))[1]
    assert "empty" in kernel_cache.decode(b"")[1]
    assert "no hf_flashpatch-cubin header" in kernel_cache.decode(cubin)[1]  # a bare cubin (old layout)
    assert "format" in kernel_cache.decode(blob.replace(b"cubin 1 ", b"cubin 9 ", 1))[1]
    assert "ELF" in kernel_cache.decode(kernel_cache.encode(b"garbage"))[1]


# ---------------------------------------------------------------------------- unwritable cache


@needs_nvcc
@pytest.mark.parametrize(
    "fault", [
        "cache-path-is-a-file",
        "rename-erofs",
        "fsync-enospc",
        pytest.param("chmod-0555", marks=pytest.mark.skipif(os.geteuid() == 0, reason="root ignores modes")),
    ],
)  # fmt: skip
def test_unwritable_cache_serves_the_kernel_with_one_warning(dirs, tmp_path, monkeypatch, fault):
    cache, systmp = dirs
    if fault == "cache-path-is-a-file":
        (tmp_path / "file").write_text("not a directory")
        cache = tmp_path / "file" / "cache"
        monkeypatch.setenv("HF_FLASHPATCH_CACHE", str(cache))
    elif fault == "chmod-0555":
        cache.mkdir()
        cache.chmod(0o555)
    else:
        name, err = ("replace", errno.EROFS) if fault == "rename-erofs" else ("fsync", errno.ENOSPC)

        def fail(*args):
            raise OSError(err, os.strerror(err))

        monkeypatch.setattr(os, name, fail)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first, _ = build.compile_cubin(SPEC)
        second, _ = build.compile_cubin(SPEC)
    assert first == second and first[:4] == b"\x7fELF"
    messages = [str(w.message) for w in caught]
    assert len(messages) == 1 and "cannot be written" in messages[0], messages
    if cache.is_dir():
        assert _files(cache) == []  # no entry, no temp file
    assert _files(systmp) == []


@needs_nvcc
def test_entry_is_fsynced_before_the_rename(dirs, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("replace", str(src)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    build.compile_cubin(SPEC)
    renames = [i for i, (what, _) in enumerate(events) if what == "replace"]
    assert len(renames) == 1
    tmp = events[renames[0]][1]
    assert ("fsync", tmp) in events[: renames[0]], events


# ------------------------------------------------------------------------- permissions, leftovers


@needs_nvcc
@pytest.mark.parametrize(
    "umask,file_mode,dir_mode",
    [(0o022, 0o644, 0o755), (0o002, 0o644, 0o775), (0o077, 0o600, 0o700)],
    ids=["umask-022", "umask-002", "umask-077-private"],
)
def test_entries_are_readable_by_other_users_as_the_umask_allows(dirs, umask, file_mode, dir_mode):
    cache, _ = dirs
    old = os.umask(umask)
    try:
        build.compile_cubin(SPEC)
    finally:
        os.umask(old)
    (entry,) = _files(cache)
    assert stat.S_IMODE((cache / entry).stat().st_mode) == file_mode
    assert stat.S_IMODE(cache.stat().st_mode) == dir_mode


def _dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


@needs_nvcc
def test_stale_temp_files_are_removed_and_live_ones_kept(dirs):
    cache, systmp = dirs
    cache.mkdir()
    host, me, dead = kernel_cache.host_tag(), os.getpid(), _dead_pid()
    hour_ago = time.time() - 3600
    made = {
        f".fwd-aa.entry.{host}.{dead}.0123abcd.tmp": (cache, None, False),  # writer dead: removed
        f".fwd-bb.entry.{host}.{me}.0123abcd.tmp": (cache, None, True),  # writer alive: kept
        ".fwd-cc.entry.tmp": (cache, hour_ago, True),  # no host and pid: not a name we write
        f".fwd-dd.entry.{host}.{me}.4567abcd.tmp": (cache, hour_ago, False),  # alive but an hour old: pid reused
        f".fwd-ee.entry.ffffffff.{dead}.0123abcd.tmp": (cache, None, True),  # another host, fresh: kept
        f".fwd-ff.entry.ffffffff.{dead}.0123abcd.tmp": (cache, hour_ago, False),  # another host, old: removed
        "tmpk3j_x9a1.cubin.tmp": (cache, hour_ago, False),  # 0.1.0's mkstemp temp, old: removed
        "tmpq8z_0b2c.cubin.tmp": (cache, None, True),  # 0.1.0's mkstemp temp, fresh: kept
        "notes.txt": (cache, hour_ago, True),  # not ours
        f"hf_flashpatch-nvcc-{host}-{dead}-abc_123x": (systmp, None, False),  # killed nvcc's work dir
        f"hf_flashpatch-nvcc-{host}-{me}-abc_456y": (systmp, None, True),  # a live compile's work dir
    }
    for name, (where, mtime, _) in made.items():
        if where is systmp:
            (where / name).mkdir()
            (where / name / "kernel.cubin").write_bytes(b"\x7fELF partial")
        else:
            (where / name).write_bytes(b"partial")
        if mtime is not None:
            os.utime(where / name, (mtime, mtime))
    build.compile_cubin(SPEC)
    for name, (where, _, kept) in made.items():
        assert (where / name).exists() == kept, name
    assert len([n for n in _files(cache) if n.endswith(".entry")]) == 1


_KILL_CHILD = """
import os, signal, subprocess
from hf_flashpatch.kernels import build
real_run = subprocess.run
def die(*args, **kwargs):
    if {after_nvcc}:
        real_run(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGKILL)
if {after_nvcc}:
    build.subprocess.run = lambda cmd, *a, **k: die(cmd, *a, **k) if "-cubin" in cmd else real_run(cmd, *a, **k)
else:
    os.fsync = die  # killed with the entry's temp file written, before the rename
build.compile_cubin(build.KernelBuild("selftest.cu", (("SELFTEST_SPIN", "7"),)))
"""


@needs_nvcc
@pytest.mark.parametrize("after_nvcc", [True, False], ids=["killed-after-nvcc", "killed-before-rename"])
def test_killed_compile_is_cleaned_up_by_the_next(dirs, after_nvcc):
    cache, systmp = dirs
    env = {**os.environ, "HF_FLASHPATCH_CACHE": str(cache), "TMPDIR": str(systmp)}
    child = subprocess.run([sys.executable, "-c", _KILL_CHILD.format(after_nvcc=after_nvcc)], env=env)
    assert child.returncode == -signal.SIGKILL
    left = _files(systmp) if after_nvcc else _files(cache)
    assert len(left) == 1 and not [n for n in _files(cache) if n.endswith(".entry")], left
    cubin, _ = build.compile_cubin(SPEC)
    assert cubin[:4] == b"\x7fELF"
    assert _files(systmp) == [] and [n for n in _files(cache) if not n.endswith(".entry")] == []


# ------------------------------------------------------------------------------------ cache key


@needs_nvcc
def test_cache_is_keyed_by_nvcc_flags_and_package_version(dirs, monkeypatch):
    cache, _ = dirs

    def compile_count():
        build.compile_cubin(SPEC)
        return len(_files(cache))

    assert compile_count() == 1
    assert compile_count() == 1  # same everything: a hit
    monkeypatch.setattr(hf_flashpatch, "__version__", "999.0")
    assert compile_count() == 2
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "-lineinfo")  # nvcc reads it: it changes the cubin
    assert compile_count() == 3
    monkeypatch.delenv("NVCC_APPEND_FLAGS")
    monkeypatch.setattr(build, "NVCC_FLAGS", (*build.NVCC_FLAGS, "-lineinfo"))
    assert compile_count() == 4
