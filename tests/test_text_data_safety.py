"""The text cache survives runs filling it at once; unusable data files raise one clear TextDataError."""

from __future__ import annotations

import os

import pytest

from hf_flashpatch import text_data


def test_runs_filling_the_text_cache_at_once_do_not_collide(tmp_path, monkeypatch):
    """Another run writes the whole cache between this run's write of train.txt and its rename.

    With one fixed temp name the other run renames this run's temp file away, and this run's rename
    fails with FileNotFoundError; with a temp file per writer both finish and the cache is whole.
    """
    docs = [f"document {i}\n" + "word " * 50 for i in range(20)]
    monkeypatch.setattr(text_data, "documents", lambda source="auto": ("pydoc", docs))
    real_replace, interleaved = os.replace, []

    def replace(src, dst, *args, **kwargs):
        if not interleaved:
            interleaved.append(str(src))
            text_data.write_text_corpus(tmp_path)  # the other run, start to finish, at the worst moment
        return real_replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    files = text_data.write_text_corpus(tmp_path)
    monkeypatch.undo()
    assert interleaved, "write_text_corpus no longer renames a temp file into place"
    train_docs = [d for i, d in enumerate(docs) if i % 10 != 9]
    eval_docs = [d for i, d in enumerate(docs) if i % 10 == 9]
    assert open(files["train"], encoding="utf-8").read() == "\n\n".join(train_docs) + "\n"
    assert open(files["eval"], encoding="utf-8").read() == "\n\n".join(eval_docs) + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["SOURCE", "eval.txt", "train.txt"]  # no temp left


@pytest.mark.parametrize("content, message", [
    (b"", "is empty"),
    (b"\n \n\n", "holds only blank lines"),
    (b"caf\xe9 au lait\n", "is not UTF-8 text: invalid continuation byte at byte 3"),
    ("one document é".encode()[:-1], "is not UTF-8 text: unexpected end of data at byte 13"),
    (b"a single document\nof two lines\n", "holds only one document"),
])
def test_unusable_data_file_raises_text_data_error(tmp_path, content, message):
    path = tmp_path / "data.txt"
    path.write_bytes(content)
    with pytest.raises(text_data.TextDataError, match=f"{path} {message}"):
        text_data.load_text_splits(str(path))


def test_bad_paths_raise_text_data_error(tmp_path):
    with pytest.raises(text_data.TextDataError, match="does not exist"):
        text_data.load_text_splits(str(tmp_path / "nowhere.txt"))
    with pytest.raises(text_data.TextDataError, match="not a saved dataset"):
        text_data.load_text_splits(str(tmp_path))
    good = tmp_path / "train.txt"
    good.write_text("first\n\nsecond\n")
    with pytest.raises(text_data.TextDataError, match=f"{tmp_path} is a folder; expected a text file"):
        text_data.load_text_splits(str(good), eval_data=str(tmp_path))


def test_a_utf8_character_cut_by_a_read_chunk_is_fine(tmp_path):
    path = tmp_path / "data.txt"
    path.write_bytes(b"a" * ((1 << 20) - 1) + "é\n\nsecond document\n".encode())  # é straddles the 1 MiB chunks
    text_data.check_data_path(path)
    path.write_bytes(path.read_bytes() + b"\xff")
    with pytest.raises(text_data.TextDataError, match=f"invalid start byte at byte {(1 << 20) + 19}"):
        text_data.check_data_path(path)


def test_a_cache_killed_before_its_source_record_is_written_again(tmp_path, monkeypatch):
    """A kill between the data files' renames and SOURCE's left pydoc text that a later run asking for wiki
    trained on without a word (a cache without SOURCE used to serve any source)."""
    monkeypatch.setattr(text_data, "documents", lambda source="auto": ("pydoc", [f"pydoc {i}" for i in range(20)]))
    text_data.write_text_corpus(tmp_path, source="pydoc")
    (tmp_path / "SOURCE").unlink()  # where the kill left it
    monkeypatch.setattr(text_data, "documents", lambda source="auto": ("wiki", [f"wiki {i}" for i in range(20)]))
    monkeypatch.setattr(text_data, "is_installed", lambda source: True)
    text_data.check_corpus("wiki", tmp_path)  # incomplete, not "another source": it will be written
    files = text_data.write_text_corpus(tmp_path, source="wiki")
    assert open(files["train"], encoding="utf-8").read().startswith("wiki 0")
    assert text_data.cached_source(tmp_path) == "wiki"
    with pytest.raises(text_data.TextDataError, match="holds 'wiki' text, not 'pydoc'"):  # whole now: refused
        text_data.check_corpus("pydoc", tmp_path)


def test_a_rewrite_drops_the_old_source_record_before_touching_the_files(tmp_path, monkeypatch):
    """Killed after the new train.txt, the cache must not read as the old source's (train new, eval old)."""
    monkeypatch.setattr(text_data, "documents", lambda source="auto": ("pydoc", [f"pydoc {i}" for i in range(20)]))
    text_data.write_text_corpus(tmp_path, source="pydoc")
    (tmp_path / "eval.txt").unlink()  # a cache missing a file is rewritten

    class Killed(BaseException):
        pass

    real_replace = os.replace

    def die_after_train(src, dst, *args, **kwargs):
        real_replace(src, dst, *args, **kwargs)
        if str(dst).endswith("train.txt"):
            raise Killed

    monkeypatch.setattr(os, "replace", die_after_train)
    with pytest.raises(Killed):
        text_data.write_text_corpus(tmp_path, source="pydoc")
    monkeypatch.undo()
    assert text_data.cached_source(tmp_path) is None and not text_data._complete(tmp_path)
