"""Prompt lookup: the per-request index gives the scan's answer at every length of a growing list."""

from __future__ import annotations

import random

import pytest

from dspark_bench.drafters.ngram import NgramIndex, lookup


@pytest.mark.parametrize("vocab, sizes", [(3, (3, 1)), (8, (3, 1)), (50, (4, 2)), (5, (1, 1))])
def test_index_answers_as_the_scan_at_every_length(vocab, sizes):
    rng = random.Random(vocab)
    for _ in range(20):
        tokens = [rng.randrange(vocab) for _ in range(120)]
        index = NgramIndex(*sizes)
        length = 0
        while length < len(tokens):  # grow by rounds of 1 to 8 tokens, as committed tokens arrive
            length = min(len(tokens), length + rng.randint(1, 8))
            seen = tokens[:length]
            assert index.lookup(seen, 7) == lookup(seen, *sizes, 7), (seen, sizes)


def test_index_finds_the_most_recent_match_of_the_longest_suffix():
    tokens = [5, 6, 7, 1, 6, 7, 2, 9, 6, 7]
    index = NgramIndex(3, 1)
    assert index.lookup(tokens, 3) == [2, 9, 6] == lookup(tokens, 3, 1, 3)  # "6 7" last seen at 4, then 2 9 6
    assert index.lookup([*tokens, 2], 2) == [9, 6]  # "6 7 2" now matches at 4
    assert NgramIndex(3, 1).lookup([1], 3) == [] and NgramIndex(3, 2).lookup([4, 4], 3) == []
    assert index.lookup([5, 6, 7, 5, 6], 2) == [7, 5]  # a shorter list (another request's): indexed afresh
