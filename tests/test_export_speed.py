"""The export's shortcuts write what the plain walks write: the canonical text of containers
passed through as they are (checked against the independent ``jcs`` package, refusals with
the same messages) and the transfer program's stripes laid out per run of units (checked
against the per-unit loop they replace)."""

from __future__ import annotations

import hashlib
import math
import random

import jcs
import pytest

from blitzplan.errors import InvalidInputError
from blitzplan.scale.stripe_bytes import Stripe, grouped, lacking
from blitzplan.wire.canonical import canonical_json, signed_json

_FLOATS = [
    0.0,
    -0.0,
    1.0,
    2.5,
    1e-4,
    9.99e-5,
    1e-7,
    3e-6,
    1e16,
    1e21,
    1e22,
    2.0**53,
    0.1,
    -7.25,
    1.2e-5,
]


def _number(rng: random.Random) -> object:
    pick = rng.random()
    if pick < 0.3:
        return rng.randint(-(2**53) + 1, 2**53 - 1) if rng.random() < 0.2 else rng.randint(0, 99)
    if pick < 0.6:
        return rng.choice(_FLOATS)
    if pick < 0.8:
        return rng.uniform(-10, 10) * 10 ** rng.randint(-8, 23)
    return rng.choice([True, False, None, "s", "é\n", "h0/gpu1"])


def _value(rng: random.Random, depth: int) -> object:
    shape = rng.randrange(9 if depth < 3 else 3)
    if shape == 0:
        return _number(rng)
    if shape == 1:  # all ints (a step's feeds)
        return [rng.randint(0, 2**40) for _ in range(rng.randrange(4))]
    if shape == 2:  # all floats, plain or not
        return tuple(rng.choice([*_FLOATS[3:], 0.5, 123.456]) for _ in range(rng.randrange(4)))
    if shape == 3:  # lists of ints (a step's ranges), sometimes a tuple or a float among them
        rows: list[object] = [[rng.randint(0, 99) for _ in range(4)] for _ in range(3)]
        if rng.random() < 0.3:
            rows.append((1, 2.0) if rng.random() < 0.5 else (3, 4))
        return rows
    if shape == 4:
        return [str(rng.randrange(50)) for _ in range(rng.randrange(3))]
    if shape == 5:  # mixed
        return [_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    names = ["id", "b", "\ue000", "\U0001f600", "z", "stripe", "é"]
    return {rng.choice(names): _value(rng, depth + 1) for _ in range(rng.randrange(5))}


def test_canonical_text_matches_jcs_on_random_documents() -> None:
    rng = random.Random(11)
    for _ in range(3000):
        value = _value(rng, 0)
        assert canonical_json(value) == jcs.canonicalize(value).decode(), value


def test_signed_text_is_the_document_with_its_digest() -> None:
    rng = random.Random(5)
    for _ in range(300):
        document = {f"k{rng.randrange(30)}": _value(rng, 1) for _ in range(rng.randrange(6))}
        extra = {"timing": [rng.random(), 1.0]} if rng.random() < 0.5 else None
        key = rng.choice(["a", "k15", "plan_id", "zz"])
        text, hexdigest = signed_json(document, key, extra)
        assert hexdigest == hashlib.sha256(jcs.canonicalize(document)).hexdigest()
        whole = {**document, key: hexdigest, **(extra or {})}
        assert text == jcs.canonicalize(whole).decode()


@pytest.mark.parametrize("at", [0, 1, 5])
def test_a_bad_item_in_a_passed_list_is_refused_as_before(at: int) -> None:
    """The shortcuts look at a list as a whole; one bad item anywhere still gets the message
    the item-by-item walk gives it."""
    for bad, message in (
        (2**60, "beyond 2\\*\\*53"),
        (-(2**53), "beyond 2\\*\\*53"),
        (math.inf, "no JSON form"),
        (math.nan, "no JSON form"),
        ("a\x00", "NUL"),
    ):
        kind = type(bad)
        base = {int: 7, float: 0.5, str: "a"}[kind]
        items = [base] * 6
        items[at] = bad
        for value in (items, tuple(items), [[base, base], items], {"x": items}):
            with pytest.raises(InvalidInputError, match=message):
                canonical_json(value)


def _old_ranges(
    present: list[bool], unit_bytes: list[int], lo: float, hi: float, scale: int
) -> tuple[object, ...]:
    """The per-unit loop the runs replace: each lacked unit's bytes, then grouped."""
    spans = []
    for unit, size in enumerate(unit_bytes):
        if not (present and present[unit]):
            total = size * scale
            spans.append((unit, round(lo * total), round(hi * total)))
    return grouped((u, u, a, b - a) for u, a, b in spans)


def test_stripes_laid_out_per_run_of_units_equal_the_per_unit_loop() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        n = rng.randint(1, 12)
        sizes = [rng.choice([0, 1, 3, 1000, 7919]) for _ in range(2)]
        unit_bytes = [rng.choice(sizes) for _ in range(n)]
        present = [rng.random() < 0.3 for _ in range(n)] if rng.random() < 0.6 else []
        lo = rng.choice([0.0, 0.25, rng.random()])
        hi = rng.choice([lo, 1.0, min(1.0, lo + rng.random() / 4)])
        scale = rng.choice([1, 2, 4])
        stripe = Stripe(lacking(present, unit_bytes, {}), scale, (lo, hi))
        assert stripe.ranges == _old_ranges(present, unit_bytes, lo, hi, scale)
        spans = [
            (u, round(lo * (s * scale)), round(hi * (s * scale)))
            for u, s in enumerate(unit_bytes)
            if not (present and present[u])
        ]
        assert stripe.spans == spans
        assert stripe.total == sum(b - a for _, a, b in spans if b > a)


def test_a_float_field_left_as_it_is_only_when_finite() -> None:
    """The document's walk passes finite floats by; +inf still becomes null where the field
    means 'never' and is refused elsewhere, as is NaN."""
    from blitzplan.scale.document import _info, _nulls
    from blitzplan.wire.scaleprogram import NewInstanceInfo, Release

    release = {"instance": "i", "role": "decode", "gpus": ["g"], "at_s": math.inf}
    assert _nulls(_info(Release), dict(release), "$")["at_s"] is None
    assert _nulls(_info(Release), {**release, "at_s": 2.5}, "$")["at_s"] == 2.5
    with pytest.raises(InvalidInputError, match="NaN"):
        _nulls(_info(Release), {**release, "at_s": math.nan}, "$")
    info = {"name": "n", "gpus": ["g"], "role": "decode", "live": False, "ready_at_s": 1.0}
    written = _nulls(_info(NewInstanceInfo), {**info, "layer_ready_s": [1.0, math.inf]}, "$")
    assert written["layer_ready_s"] == [1.0, None]
