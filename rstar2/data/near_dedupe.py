"""Near-duplicate detection with MinHash over word shingles (datasketch ``MinHash`` + ``MinHashLSH``).

Exact dedupe (curate.dedupe) misses copies that differ in a word or in punctuation, e.g. the same AoPS problem
posted twice with "Find" / "Determine". Here every problem becomes the set of its word k-shingles; MinHash LSH
proposes candidate pairs whose estimated Jaccard similarity is near the threshold, and each candidate is then
checked with the *exact* Jaccard of the shingle sets, so the LSH's false positives never drop a problem.

Math problems that share a template but differ in one number are different problems with different answers:
with 5-word shingles, changing one number in a 40-word problem changes 5 of ~36 shingles (Jaccard ~0.76), so a
threshold of 0.9 keeps them while catching reworded copies.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from datasketch import MinHash, MinHashLSH


def shingles(words: Sequence[str], k: int) -> set[str]:
    """The set of word k-shingles of ``words`` (a text shorter than k words is one shingle of all its words)."""
    if len(words) < k:
        return {" ".join(words)} if words else set()
    return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}


def jaccard(a: set, b: set) -> float:
    """Exact Jaccard similarity |a ∩ b| / |a ∪ b| (0.0 for two empty sets)."""
    union = len(a | b)
    return len(a & b) / union if union else 0.0


def near_duplicates(docs: Sequence[Sequence[str]], threshold: float = 0.9, num_perm: int = 128,
                    shingle_words: int = 5, seed: int = 1) -> list[int | None]:
    """For each document (a list of word tokens), the index of an earlier kept document it nearly duplicates.

    Documents are processed in order; the first of a group is kept (``None``) and later ones point to it
    (an int). Only kept documents are indexed, so a chain A~B~C with A !~ C keeps C.

    Args:
        docs: tokenised documents, e.g. ``curate.tokens(problem)``.
        threshold: minimum exact Jaccard similarity of the shingle sets to call two documents duplicates, in (0, 1].
        num_perm: MinHash permutations (more = fewer LSH misses, slower).
        shingle_words: words per shingle.
        seed: MinHash seed (fixed, so the result is deterministic).

    Returns:
        A list as long as ``docs``: ``None`` (kept) or the index of the kept document it duplicates.

    Raises:
        ValueError: threshold outside (0, 1], num_perm < 2 or shingle_words < 1.
    """
    if not 0 < threshold <= 1:
        raise ValueError(f"near-dedupe threshold must be in (0, 1], got {threshold}")
    if num_perm < 2 or shingle_words < 1:
        raise ValueError(f"near-dedupe needs num_perm >= 2 and shingle_words >= 1, got {num_perm}, {shingle_words}")
    sets = [shingles(list(d), shingle_words) for d in docs]
    # bulk() permutes every shingle hash with numpy in one pass per document. crc32 (C, deterministic across
    # processes, unlike hash()) replaces the default pure-Python sha1 wrapper: 3x faster overall; the MinHash
    # permutations on top of it provide the randomness.
    hashes = MinHash.bulk([[s.encode("utf-8") for s in sh] for sh in sets], num_perm=num_perm, seed=seed,
                          hashfunc=zlib.crc32)
    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
    result: list[int | None] = []
    for i, (sh, mh) in enumerate(zip(sets, hashes)):
        if not sh:  # an empty problem has no content to compare; curation drops it earlier anyway
            result.append(None)
            continue
        # query() returns keys in arbitrary order; the earliest matching document is the canonical copy.
        match = min((j for j in lsh.query(mh) if jaccard(sh, sets[j]) >= threshold), default=None)
        if match is None:
            lsh.insert(i, mh)
        result.append(match)
    return result
