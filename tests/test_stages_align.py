"""Cross-tokenizer alignment (spcli/stages/align.py): pure properties over character offsets, checked
against a brute-force reference on seeded random tokenizations, then on two real tokenizers."""

from __future__ import annotations

import random

import pytest
import torch

from spcli.stages.align import AlignmentError, align, carry, content_regions, restrict


def random_offsets(rng: random.Random, length: int, zero_width: float = 0.1) -> list[tuple[int, int]]:
    """A tokenization of `length` characters: consecutive pieces of 1-6 characters; some tokens share one
    character (a multi-byte character split into byte tokens), some cover nothing (a BOS, a byte-level space)."""
    out, pos = [], 0
    while pos < length:
        r = rng.random()
        if r < zero_width:
            out.append((pos, pos))
            continue
        if r < 2 * zero_width:  # one character in 2-3 byte tokens
            out += [(pos, pos + 1)] * rng.randint(2, 3)
            pos += 1
            continue
        step = min(length - pos, rng.randint(1, 6))
        out.append((pos, pos + step))
        pos += step
    return out


def brute_pairs(base, base_regions, spec, spec_regions) -> set[tuple[int, int]]:
    """Reference: (i, j) when some shared character (region k, position c) is inside both tokens."""
    def chars(span, regions):
        return {(k, c - lo) for k, (lo, hi) in enumerate(regions) for c in range(max(span[0], lo), min(span[1], hi))}

    spec_chars = [chars(s, spec_regions) for s in spec]
    return {(i, j) for i, b in enumerate(base) for bc in [chars(b, base_regions)]
            for j in range(len(spec)) if bc & spec_chars[j]}


def pairs_of(alignment) -> set[tuple[int, int]]:
    return set(zip(alignment.base_index.tolist(), alignment.spec_index.tolist()))


@pytest.mark.parametrize("seed", range(20))
def test_pairs_match_brute_force_and_every_base_token_is_scored_or_forced(seed):
    rng = random.Random(seed)
    length = rng.randint(1, 80)
    base, spec = random_offsets(rng, length), random_offsets(rng, length)
    a = align(base, [(0, length)], spec, [(0, length)])
    assert pairs_of(a) == brute_pairs(base, [(0, length)], spec, [(0, length)])
    importance = torch.rand(len(spec))
    mapped = carry(importance, a)
    for i, (lo, hi) in enumerate(base):
        covering = [j for j, (c, d) in enumerate(spec) if max(c, lo) < min(d, hi)]
        assert bool(a.forced[i]) == (not covering)  # scored, or forced: never neither
        assert mapped[i] == (max(importance[j] for j in covering) if covering else 0.0)
        assert not covering or hi > lo  # a token that covers a character always has a counterpart


@pytest.mark.parametrize("seed", range(10))
def test_chat_regions_under_two_templates(seed):
    """Two renderings of the same messages: template text differs, contents are shared; base template tokens
    are forced, speculator template tokens score nothing."""
    rng = random.Random(100 + seed)
    contents = ["".join(rng.choice("ab cé東") for _ in range(rng.randint(0, 30))) for _ in range(rng.randint(1, 4))]
    base_text = "<s>" + "".join(f"[INST] {c} [/INST]" for c in contents) + " "
    spec_text = "".join(f"<|im_start|>user\n{c}<|im_end|>\n" for c in contents) + "<|im_start|>assistant\n"
    base_regions, spec_regions = content_regions(base_text, contents), content_regions(spec_text, contents)
    assert [base_text[a:b] for a, b in base_regions] == contents == [spec_text[a:b] for a, b in spec_regions]
    base, spec = random_offsets(rng, len(base_text)), random_offsets(rng, len(spec_text))
    a = align(base, base_regions, spec, spec_regions)
    assert pairs_of(a) == brute_pairs(base, base_regions, spec, spec_regions)
    in_content = lambda span, regions: any(max(span[0], lo) < min(span[1], hi) for lo, hi in regions)
    for i, span in enumerate(base):
        assert bool(a.forced[i]) == (not in_content(span, base_regions))
    for j in set(range(len(spec))) - set(a.spec_index.tolist()):
        assert not in_content(spec[j], spec_regions)


def test_content_regions_are_found_in_order_and_a_rewritten_content_is_refused():
    assert content_regions("x: hi / y: hi", ["hi", "hi"]) == [(3, 5), (11, 13)]
    with pytest.raises(AlignmentError, match="message 1's content"):
        content_regions("<user>Hi</user><user>there</user>", ["Hi", "There"])


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("mode", ["left", "middle"])
def test_truncation_keeps_an_alignment_of_the_kept_tokens(seed, mode):
    rng = random.Random(200 + seed)
    length = rng.randint(20, 120)
    base, spec = random_offsets(rng, length), random_offsets(rng, length)
    full = align(base, [(0, length)], spec, [(0, length)])
    n, limit = len(base), max(1, len(base) // 3)
    kept = list(range(n - limit, n)) if mode == "left" else [*range(limit // 2), *range(n - (limit - limit // 2), n)]
    spec_kept, a = restrict(full, kept)
    assert a.num_base == len(kept) and a.num_spec == len(spec_kept) == len(set(spec_kept))
    assert spec_kept == sorted(spec_kept)
    # the same pairs as the full alignment, among the kept tokens, re-indexed
    expected = {(kept.index(i), spec_kept.index(j)) for i, j in pairs_of(full) if i in kept}
    assert pairs_of(a) == expected
    assert torch.equal(a.forced, full.forced[kept])
    importance = torch.rand(len(spec))
    assert torch.equal(carry(importance[spec_kept], a), carry(importance, full)[kept])
    # a speculator token leaves only when every base token it covered left
    for j in set(range(len(spec))) - set(spec_kept):
        covered = [i for i, jj in pairs_of(full) if jj == j]
        assert covered and not set(covered) & set(kept)


def test_without_an_alignment_importance_passes_as_is():
    importance = torch.rand(7)
    assert carry(importance, None) is importance


def test_unicode_under_two_real_tokenizers(smollm2_dir, other_tokenizer_dir):
    """Multi-byte characters that both tokenizers split into byte tokens: every base token is scored or
    forced, and each one covering a character is scored by the speculator tokens on the same characters."""
    from transformers import AutoTokenizer

    base, spec = AutoTokenizer.from_pretrained(other_tokenizer_dir), AutoTokenizer.from_pretrained(smollm2_dir)
    text = "Le café à Zürich — naïve résumé, 東京タワー 🙂🙂 ünïcödé, 1987 ok."
    eb = base(text, add_special_tokens=True, return_offsets_mapping=True)
    es = spec(text, add_special_tokens=True, return_offsets_mapping=True)
    a = align(eb["offset_mapping"], [(0, len(text))], es["offset_mapping"], [(0, len(text))])
    assert pairs_of(a) == brute_pairs(eb["offset_mapping"], [(0, len(text))], es["offset_mapping"], [(0, len(text))])
    assert eb["input_ids"][0] == base.bos_token_id and bool(a.forced[0])  # the BOS covers no character
    for i, (lo, hi) in enumerate(eb["offset_mapping"]):
        assert bool(a.forced[i]) == (hi <= lo)
    shared = [i for i, (lo, hi) in enumerate(eb["offset_mapping"]) if text[lo:hi] == "東"]
    assert len(shared) > 1  # split into byte tokens, all on one character
    assert len({tuple(sorted(j for bi, j in pairs_of(a) if bi == i)) for i in shared}) == 1
