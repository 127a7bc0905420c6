"""The export's column walks write what the record-by-record walks write: lists of records with
one key set checked column by column, nested lists as one list, floats found in numpy, the
text written by msgspec (checked against the independent ``jcs`` package and ``json.dumps``),
refusals with the message of the first bad item in record order, ``_nulls`` by columns equal
to ``_nulls`` per record, and ``encode``'s digest kept as the plan's ``plan_id``."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import struct

import jcs
import msgspec
import pytest

from blitzplan.errors import InvalidInputError
from blitzplan.wire.canonical import canonical_json, signed_json
from blitzplan.wire.jcs_walk import _dump, _Marks, _prepared, _text
from tests.test_export_speed import _FLOATS, _number

_NAMES = ["id", "b", "z", "stripe", "é", "rank", "\ue000", "\U0001f600"]


def _column(rng: random.Random, depth: int) -> object:
    """A factory of one column's values: all of one kind mostly, sometimes mixed."""
    kind = rng.randrange(6 if depth < 2 else 4)
    if kind == 0:
        fixed = rng.choice([int, float, str])
        return lambda: {int: rng.randint(0, 9), float: rng.uniform(1, 2), str: "x"}[fixed]
    if kind == 1:
        return lambda: _number(rng)
    if kind == 2:  # float tuples (arrival times), small ones among them or not
        small = rng.random() < 0.5
        return lambda: tuple(
            rng.uniform(0, 1e-4 if small and rng.random() < 0.3 else 1) for _ in range(3)
        )
    if kind == 3:  # ranges: lists of int lists
        return lambda: [[rng.randint(0, 99) for _ in range(4)] for _ in range(rng.randrange(3))]
    if kind == 4:  # nested records, one key set
        return lambda: _records(rng, depth + 1, rng.randrange(4))
    keys = rng.sample(_NAMES, 2)
    return lambda: {key: _number(rng) for key in keys}


def _records(rng: random.Random, depth: int, n: int | None = None) -> list[dict[str, object]]:
    names = rng.sample(_NAMES[:6] if rng.random() < 0.8 else _NAMES, rng.randint(1, 4))
    columns = {name: _column(rng, depth) for name in names}
    count = rng.randrange(1, 8) if n is None else n
    return [{name: make() for name, make in columns.items()} for _ in range(count)]


def test_record_lists_match_jcs() -> None:
    rng = random.Random(19)
    for _ in range(1500):
        value = {"records": _records(rng, 0), "hops": [_records(rng, 1) for _ in range(3)]}
        if rng.random() < 0.3:
            value["extra"] = [[rng.choice(_FLOATS) for _ in range(3)] for _ in range(4)]
        assert canonical_json(value) == jcs.canonicalize(value).decode(), value
        text, _ = signed_json(value, "plan_id")
        assert text.replace(f',"plan_id":"{_}"', "") == jcs.canonicalize(value).decode()


def _row_walk(value: object) -> str:
    """The record-by-record walk (as before the column walks): the writer sorts nothing."""
    marks = _Marks()
    marks.as_is = False
    return _text(_prepared(value, marks), marks)


@pytest.mark.parametrize("seed", range(6))
def test_the_first_bad_item_in_record_order_is_named(seed: int) -> None:
    """Two bad items in different records and columns: the message is the first one's in
    record order, as the record-by-record walk gives it."""
    rng = random.Random(seed)
    bads = [2**60, math.inf, math.nan, "a\x00", -(2**53), {"k\x00": 1}]
    for _ in range(200):
        records = [{"a": 1, "b": 0.5, "c": "s", "d": [1.5, 2.5]} for _ in range(6)]
        for _ in range(2):
            record, name = rng.randrange(6), rng.choice("abcd")
            if name == "d":
                records[record]["d"] = [1.5, rng.choice(bads)]
            else:
                records[record][name] = rng.choice(bads)
        document = {"outer": [records[:3], records[3:]]} if rng.random() < 0.5 else records
        with pytest.raises(InvalidInputError) as row:
            _row_walk(document)
        with pytest.raises(InvalidInputError) as column:
            canonical_json(document)
        assert str(column.value) == str(row.value)


def test_msgspec_writes_prepared_values_as_json_dumps() -> None:
    rng = random.Random(4)
    floats = []
    while len(floats) < 20000:
        x = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if rng.random() < 0.5:
            x = rng.uniform(-1, 1) * 10 ** rng.randint(-4, 16)
        if math.isfinite(x) and not x.is_integer() and abs(x) >= 1e-4:
            floats.append(x)
    text = "".join(map(chr, range(0x300))) + "\U0001f600\ue000\uffff\u2028\u2029"
    for value in (
        floats,
        [rng.randint(-(2**53) + 1, 2**53 - 1) for _ in range(2000)],
        [text, "\x00" + text, "plain"],
        {"b": [True, False, None], "a": (1, 2.5), "\x7f": {}},
    ):
        expected = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        assert _dump(value, False) == expected
    assert _dump({"b": 1, "a": {"d": 2, "c": 3}}, True) == '{"a":{"c":3,"d":2},"b":1}'
    assert _dump("\ud800", False) == json.dumps("\ud800", ensure_ascii=False)  # msgspec refuses


def test_nulls_by_columns_equal_nulls_per_record() -> None:
    from blitzplan.scale.document import _info, _nulls
    from blitzplan.wire.scaleprogram import Release

    kind = msgspec.inspect.type_info(list[Release])
    rng = random.Random(8)
    for _ in range(500):
        records = [
            {"instance": "i", "role": "decode", "gpus": ["g"], "at_s": rng.uniform(0, 9)}
            for _ in range(rng.randint(1, 6))
        ]
        for _ in range(rng.randrange(3)):
            records[rng.randrange(len(records))]["at_s"] = rng.choice(
                [math.inf, math.nan, -math.inf, 0.0, 2.5]
            )
        if rng.random() < 0.2:
            del records[0]["at_s"]
        try:
            expected: object = [_nulls(_info(Release), dict(r), "$[]") for r in records]
        except InvalidInputError as error:
            expected = str(error)
        try:
            got: object = _nulls(kind, [dict(r) for r in records], "$")
        except InvalidInputError as error:
            got = str(error)
        assert got == expected


def test_encode_keeps_its_digest_as_the_plan_id() -> None:
    from blitzplan.scale import ScaleRequest, plan
    from blitzplan.scale.document import encode, plan_digest
    from tests.test_scale import MODEL, paper_state

    scale = plan(paper_state(), ScaleRequest(MODEL, prefill=6, decode=1, tp=2))
    fresh = dataclasses.replace(scale)
    assert "plan_id" not in vars(fresh)
    text = encode(fresh)
    assert vars(fresh)["plan_id"] == plan_digest(dataclasses.replace(scale))
    assert json.loads(text)["plan_id"] == fresh.plan_id
