"""WordNet 3.0's noun database and the labelling rules of the built-in datasets.

:func:`parse_data_noun` reads a ``data.noun`` file (database format, wndb(5WN); no nltk), keeping
only pointers to noun synsets. :func:`balanced_labels` labels a synset by its ancestor at depth
:data:`BALANCED_DEPTH` on the first-hypernym chain (``wordnet148``); :func:`plant_family_labels`
labels a ``noun.plant`` synset by its plant family (``wordnet-plants150``). :func:`synset_text` is
the text that gets embedded. The datasets themselves are built in :mod:`.wordnet`.

Reference:
    George A. Miller. WordNet: a lexical database for English. Communications of the ACM 38(11), 1995.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

APT_INSTALL = "apt-get install wordnet-base"
#: Depth (``entity.n.01`` is depth 0) of the ancestor that labels a ``wordnet148`` synset.
BALANCED_DEPTH = 5
#: Lexicographer file number of ``noun.plant`` in WordNet 3.0 (lexnames(5WN)); used when the
#: WordNet directory has no ``lexnames`` file (Debian's ``wordnet-base`` ships none).
NOUN_PLANT_LEXFILE = 20

_HYPERNYMS = ("@", "@i")
_MEMBER_HOLONYM = "#m"


@dataclass(frozen=True)
class Synset:
    """One noun synset of a WordNet ``data.noun`` file.

    Attributes:
        offset: byte offset of the line (the synset's id).
        lex_filenum: lexicographer file number (``20`` is ``noun.plant``).
        words: lemmas in file order, underscores kept.
        pointers: ``(symbol, target offset)`` of the pointers to noun synsets, in file order.
        gloss: the gloss (definition and example sentences).
    """

    offset: int
    lex_filenum: int
    words: tuple[str, ...]
    pointers: tuple[tuple[str, int], ...]
    gloss: str


def parse_data_noun(path: Path) -> dict[int, Synset]:
    """Parse a WordNet 3.0 ``data.noun`` file (database format, wndb(5WN)).

    Args:
        path: the ``data.noun`` file.

    Returns:
        The synsets by offset. Licence header lines (starting with two spaces) are skipped.

    >>> import tempfile
    >>> line = "00000010 03 n 02 big_cat 0 cat 1 001 @ 00000001 n 0000 | a feline; \\"a cat\\"  \\n"
    >>> with tempfile.TemporaryDirectory() as d:
    ...     p = Path(d) / "data.noun"
    ...     _ = p.write_text("  header\\n" + line)
    ...     synset = parse_data_noun(p)[10]
    >>> synset.words, synset.pointers, synset.gloss
    (('big_cat', 'cat'), (('@', 1),), 'a feline; "a cat"')
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"WordNet noun database {path} not found; install it with `{APT_INSTALL}`")
    synsets = {}
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if line.startswith("  ") or not line.strip():
                continue
            head, _, gloss = line.partition(" | ")
            fields = head.split()
            try:
                n_words = int(fields[3], 16)
                words = tuple(fields[4 + 2 * i] for i in range(n_words))
                at = 4 + 2 * n_words
                n_pointers = int(fields[at])
                pointers = tuple(
                    (fields[at + 1 + 4 * j], int(fields[at + 2 + 4 * j]))
                    for j in range(n_pointers)
                    if fields[at + 3 + 4 * j] == "n"
                )
                synset = Synset(int(fields[0]), int(fields[1]), words, pointers, gloss.strip())
            except (IndexError, ValueError) as err:
                raise ValueError(f"{path}:{number}: not a WordNet data.noun line ({err})") from err
            synsets[synset.offset] = synset
    return synsets


def plant_lexfile(wordnet_dir: Path) -> int:
    """The lexicographer file number of ``noun.plant``: from ``wordnet_dir/lexnames`` if present.

    Args:
        wordnet_dir: the WordNet database directory.

    Returns:
        The number from the ``lexnames`` file, or :data:`NOUN_PLANT_LEXFILE` (20) without one.
    """
    lexnames = Path(wordnet_dir) / "lexnames"
    if not lexnames.is_file():
        return NOUN_PLANT_LEXFILE
    for line in lexnames.read_text(encoding="utf-8").splitlines():
        fields = line.split()
        if len(fields) >= 2 and fields[1] == "noun.plant":
            return int(fields[0])
    raise ValueError(f"{lexnames} has no noun.plant entry")


def synset_text(synset: Synset) -> str:
    """The text embedded for a synset: its lemmas, ``": "``, and its definition.

    Underscores become spaces, lemmas are joined by ``", "``, and the example sentences (the quoted
    parts after the definition, from the first ``; "``) are dropped.

    >>> synset_text(Synset(1, 3, ("big_cat", "cat"), (), 'a feline; "a cat"'))
    'big cat, cat: a feline'
    """
    words = ", ".join(word.replace("_", " ") for word in synset.words)
    definition = synset.gloss.split('; "')[0].strip().rstrip(";").strip()
    return f"{words}: {definition}"


def _first_pointer(synset: Synset, symbols: Iterable[str]) -> int | None:
    """Target of the first pointer with the first of ``symbols`` that the synset has."""
    for symbol in symbols:
        for pointer_symbol, target in synset.pointers:
            if pointer_symbol == symbol:
                return target
    return None


def hypernym_chains(synsets: Mapping[int, Synset]) -> dict[int, tuple[int, ...]]:
    """Root-first chain of every synset along its first hypernym.

    The parent of a synset is the target of its first ``@`` pointer, or of its first ``@i``
    (instance hypernym) pointer when it has no ``@``; a synset without either is a root.

    Returns:
        For each offset, the offsets from the root down to the synset itself.
    """
    chains: dict[int, tuple[int, ...]] = {}
    for offset in synsets:
        path = []
        node: int | None = offset
        while node is not None and node not in chains:
            if node in path:
                raise ValueError(f"hypernym cycle through synset {node:08d}")
            path.append(node)
            node = _first_pointer(synsets[node], _HYPERNYMS)
        prefix = chains[node] if node is not None else ()
        for node in reversed(path):
            prefix = (*prefix, node)
            chains[node] = prefix
    return chains


def balanced_labels(synsets: Mapping[int, Synset], depth: int = BALANCED_DEPTH) -> dict[int, int]:
    """Label every synset deeper than ``depth`` by its first-hypernym ancestor at ``depth``.

    Depth 0 is the root (``entity.n.01``); the ancestor itself and shallower synsets get no label.

    Returns:
        ``{synset offset: ancestor offset}``.
    """
    return {offset: chain[depth] for offset, chain in hypernym_chains(synsets).items() if len(chain) > depth + 1}


def _is_family(synset: Synset) -> bool:
    return any("family" in word.lower().split("_") for word in synset.words)


def plant_family_labels(synsets: Mapping[int, Synset], lex_filenum: int) -> dict[int, int]:
    """Label each ``noun.plant`` synset by its family.

    From the synset, repeatedly step to the target of its first member-holonym pointer (``#m``:
    species -> genus -> family), or of its first hypernym (``@``, then ``@i``) when it has none,
    and take the first synset reached that has the word ``family`` in one of its lemmas
    (``rose_family``, ``family_Rosaceae``; ``subfamily`` does not count). Synsets that are
    themselves families, and those whose walk ends without a family, get no label.

    Returns:
        ``{synset offset: family offset}``.
    """
    labels = {}
    for offset, synset in synsets.items():
        if synset.lex_filenum != lex_filenum or _is_family(synset):
            continue
        seen = {offset}
        node = _first_pointer(synset, (_MEMBER_HOLONYM, *_HYPERNYMS))
        while node is not None and node not in seen:
            if _is_family(synsets[node]):
                labels[offset] = node
                break
            seen.add(node)
            node = _first_pointer(synsets[node], (_MEMBER_HOLONYM, *_HYPERNYMS))
    return labels
