"""ScalePlan documents and the program export: canonical form (RFC 8785, checked by an
independent JCS implementation), plan_id/program_id integrity, the program rules on read, the
strict schema and the probes it refuses."""

from __future__ import annotations

import hashlib
import json
import math
import random
import struct
from collections.abc import Callable
from typing import Any

import pytest

from blitzplan import InvalidInputError
from blitzplan.scale import ScalePlan, ScaleRequest, plan
from blitzplan.scale.document import document_digest, json_schema
from blitzplan.scale.export import program_json
from blitzplan.wire.canonical import canonical_json, es_number
from blitzplan.wire.scaleprogram import ScaleProgram, read_program_json
from tests.test_scale import MODEL, paper_state

jcs = pytest.importorskip("jcs")
jsonschema = pytest.importorskip("jsonschema")


@pytest.fixture(scope="module")
def scale() -> ScalePlan:
    return plan(paper_state(), ScaleRequest(MODEL, prefill=6, decode=1, tp=2))


@pytest.fixture(scope="module")
def relayed() -> ScalePlan:
    """A plan with relays, feeds and plan-held sources (greedy on PCIe hosts)."""
    from blitzplan import ClusterState, load_topology

    state = ClusterState(load_topology("paper-a100-16"), models=["llama-3-8b"])
    state.add_instance("llama-3-8b", gpus=["h1/gpu7"], role="decode")
    return plan(state, ScaleRequest("llama-3-8b", prefill=6, tp=1))


# --- canonical form --------------------------------------------------------------------------


# ECMAScript Number::toString outputs (ECMA-262, 7.1.12.1; RFC 8785 appendix B)
ES_NUMBERS = [
    (0.0, "0"),
    (-0.0, "0"),
    (1.0, "1"),
    (-1.5, "-1.5"),
    (0.1, "0.1"),
    (1e-6, "0.000001"),
    (1e-7, "1e-7"),
    (1.5e-7, "1.5e-7"),
    (123e-20, "1.23e-18"),
    (1e21, "1e+21"),
    (1e20, "100000000000000000000"),
    (333333333.3333332, "333333333.3333332"),
    (9007199254740992.0, "9007199254740992"),
    (295147905179352830000.0, "295147905179352830000"),
    (5e-324, "5e-324"),
    (1.7976931348623157e308, "1.7976931348623157e+308"),
    (4.35, "4.35"),
    (0.002, "0.002"),
]


def test_numbers_are_written_as_ecmascript_writes_them() -> None:
    for value, text in ES_NUMBERS:
        assert es_number(value) == text, value
        assert jcs.canonicalize(value).decode() == text


def test_property_random_doubles_match_an_independent_jcs() -> None:
    """Property: for random bit patterns, canonical_json writes what the jcs package writes,
    and the text reads back to the same double."""
    rng = random.Random(7)
    values = []
    while len(values) < 3000:
        value = struct.unpack("d", struct.pack("Q", rng.getrandbits(64)))[0]
        if math.isfinite(value):
            values.append(value)
    values += [rng.uniform(0, 10) * 10 ** rng.randint(-9, 23) for _ in range(3000)]
    assert canonical_json(values) == jcs.canonicalize(values).decode()
    assert [float(x) for x in json.loads(canonical_json(values))] == values


def test_keys_sort_by_utf16_and_strings_escape_as_jcs() -> None:
    value = {"\U0001f600": 1, "\ue000": 2, "a\nb": '\x01"\\é', "b": [None, True, False]}
    assert canonical_json(value) == jcs.canonicalize(value).decode()


def test_what_json_cannot_hold_is_refused() -> None:
    for bad, message in (
        ({"x": math.inf}, "no JSON form"),
        ({"x": 2**60}, "beyond 2\\*\\*53"),
        ({"x": "a\x00b"}, "NUL"),
        ({"x": {1, 2}}, "set has no JSON form"),
    ):
        with pytest.raises(InvalidInputError, match=message):
            canonical_json(bad)


def test_a_document_is_its_own_canonical_form_and_jcs_recomputes_plan_id(
    scale: ScalePlan,
) -> None:
    text = scale.to_json()
    document = json.loads(text)
    assert jcs.canonicalize(document) + b"\n" == text.encode()
    signed = {k: v for k, v in document.items() if k not in ("plan_id", "timing")}
    assert hashlib.sha256(jcs.canonicalize(signed)).hexdigest() == document["plan_id"]
    assert document["plan_id"] == scale.plan_id == document_digest(document)
    timed = json.loads(scale.to_json(timing=True))
    assert timed["plan_id"] == scale.plan_id and "timing" in timed


def test_a_reformatted_document_still_reads(scale: ScalePlan) -> None:
    document = json.loads(scale.to_json(timing=True))
    assert ScalePlan.from_json(json.dumps(document, indent=2)) == scale
    assert ScalePlan.from_json(scale.to_json(timing=True)) == scale


# --- integrity -------------------------------------------------------------------------------


def _signed(text: str, edit: Callable[[dict[str, Any]], None]) -> str:
    document = json.loads(text)
    edit(document)
    document["plan_id"] = document_digest(document)
    return json.dumps(document)


def test_the_integrity_check_cannot_be_switched_off(scale: ScalePlan) -> None:
    text = scale.to_json()
    document = json.loads(text)
    del document["plan_id"]
    with pytest.raises(InvalidInputError, match="plan_id must be the 64 hex digits"):
        ScalePlan.from_json(json.dumps(document))
    for bad in ("", "abc", None, 5):
        document["plan_id"] = bad
        with pytest.raises(InvalidInputError, match="plan_id must be"):
            ScalePlan.from_json(json.dumps(document))
    document = json.loads(text)
    document["notes"] = ["added"]
    with pytest.raises(InvalidInputError, match="does not match the document"):
        ScalePlan.from_json(json.dumps(document))


def test_a_member_smuggled_behind_the_timing_is_refused(scale: ScalePlan) -> None:
    """The fast check on the canonical text cuts the final timing member only when it is one
    JSON value; a duplicate key hidden there falls back to the full check and fails."""
    text = scale.to_json().rstrip("\n")
    smuggled = text[:-1] + ',"timing":{},"notes":["smuggled"]}'
    with pytest.raises(InvalidInputError, match="does not match the document"):
        ScalePlan.from_json(smuggled)


def _step_edit(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["steps"][0].update(fields)


def _fed_cycle(document: dict[str, Any]) -> None:
    """A store-and-forward step waits for its feeds: its feed waiting for it (``after``) makes a
    cycle."""
    by_id = {s["id"]: s for s in document["steps"]}
    step = next(s for s in document["steps"] if s["feeds"])
    step["store_and_forward"] = True
    by_id[step["feeds"][0]]["after"] = [step["id"]]


PROGRAM_PROBES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "negative length": (
        _step_edit(ranges=[{"first_unit": 0, "last_unit": 0, "offset": 0, "length": -5}]),
        "not inside their buffers",
    ),
    "offset past the buffer": (
        _step_edit(
            ranges=[{"first_unit": 0, "last_unit": 0, "offset": 10**12, "length": 1}], bytes=1
        ),
        "not inside their buffers",
    ),
    "bytes not the ranges' sum": (_step_edit(bytes=1), "ranges hold .* 'bytes' says 1"),
    "unknown feed": (_step_edit(feeds=[99999]), "feeds names step 99999"),
    "unknown after": (_step_edit(after=[99999]), "after names step 99999"),
    "unknown holder": (_step_edit(holder="cloud"), "holder must be one of"),
    "unknown link": (_step_edit(link="carrier-pigeon"), "link must be one of"),
    "rank out of range": (_step_edit(rank=7), "rank must be -1 or in 0..1"),
    "unknown instance": (_step_edit(instance="new99"), "'new99' is not a new instance"),
    "negative time": (_step_edit(start_s=-1.0), "start_s must be finite and >= 0"),
    "null time": (_step_edit(end_s=None), r"Expected `float`, got `null` - at `\$.steps\[0\]"),
    "zero pace": (_step_edit(pace_bytes_per_s=0.0), "pace_bytes_per_s must be > 0"),
    "unknown units": (
        _step_edit(ranges=[{"first_unit": 0, "last_unit": 999, "offset": 0, "length": 1}]),
        "units 0..999 are not units",
    ),
    "held on a stranger": (
        lambda d: d.update(held={"h9/gpu9": {"0": [[0.0, 1.0]]}}),
        "held names 'h9/gpu9'",
    ),
    "repeated step id": (lambda d: d["steps"].append(d["steps"][0]), "step ids must be unique"),
    "a wait through feeds": (
        _fed_cycle,
        r"steps wait for each other in a cycle: \[\d+, \d+, \d+\]",
    ),
    "spec of another model": (
        lambda d: d["model"].update(content_hash="0" * 64),
        "spec is model .* but its 'model' says",
    ),
}


@pytest.mark.parametrize("probe", sorted(PROGRAM_PROBES))
def test_from_json_runs_the_program_rules(scale: ScalePlan, probe: str) -> None:
    edit, message = PROGRAM_PROBES[probe]
    with pytest.raises(InvalidInputError, match=message):
        ScalePlan.from_json(_signed(scale.to_json(), edit))


def _pair_edit(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["live_pairs"][0].update(fields)


def _second_pair(**fields: Any) -> Callable[[dict[str, Any]], None]:
    return lambda d: d["live_pairs"].append({**d["live_pairs"][0], **fields})


PAIR_PROBES: dict[str, tuple[Callable[[dict[str, Any]], None], str]] = {
    "unknown policy": (_pair_edit(policy="vibes"), r"live_pairs\[0\]\.policy must be one of"),
    "unknown new": (_pair_edit(new="new99"), r"live_pairs\[0\]\.new is 'new99', no live new"),
    "new not live": (_pair_edit(new="new0"), r"live_pairs\[0\]\.new is 'new0', no live new"),
    "new in two pairs": (_second_pair(old="i9"), r"live_pairs\[1\]\.new is 'new4', a second"),
    "old in two pairs": (
        lambda d: (
            d["new_instances"][0].update(live=True),
            _second_pair(new=d["new_instances"][0]["name"], batches=[["x/r0"]])(d),
        ),
        r"live_pairs\[1\]\.old is 'i1'.* another pair's old instance",
    ),
    "old is new": (_pair_edit(old="new0"), r"live_pairs\[0\]\.old is 'new0'.* a new instance"),
    "old is mutated": (_pair_edit(old="i0"), r"live_pairs\[0\]\.old is 'i0'.* releases or mut"),
    "old empty": (_pair_edit(old=""), r"live_pairs\[0\]\.old is ''.* an empty name"),
    "no batches": (_pair_edit(batches=[]), r"live_pairs\[0\]\.batches is empty"),
    "empty batch": (_pair_edit(batches=[[]]), r"live_pairs\[0\]\.batches\[0\] is empty"),
    "empty request id": (
        _pair_edit(batches=[["i1/r0"], [""]]),
        r"live_pairs\[0\]\.batches\[1\] holds '', not a request id",
    ),
    "request in two batches": (
        _pair_edit(batches=[["i1/r0"], ["i1/r1", "i1/r0"]]),
        r"live_pairs\[0\]\.batches\[1\] holds 'i1/r0', in a second batch",
    ),
}
"""Each edit of the ``scale`` fixture's one live pair (new4 helping i1; i0 is mutated; new0 is a
new instance that is not live) and the error that names it."""


def _queued_as_batches(edit: Callable[[dict[str, Any]], None], document: dict[str, Any]) -> None:
    """``edit``, with the last pair's ``queued_requests`` kept equal to its batches' ids."""
    edit(document)
    pair = document["live_pairs"][-1]
    pair["queued_requests"] = sum(map(len, pair["batches"]))


@pytest.mark.parametrize("probe", sorted(PAIR_PROBES))
def test_both_readers_check_the_live_pairs(scale: ScalePlan, probe: str) -> None:
    edit, message = PAIR_PROBES[probe]
    assert [(p.new, p.old) for p in scale.live_pairs] == [("new4", "i1")]
    with pytest.raises(InvalidInputError, match=message):
        ScalePlan.from_json(_signed(scale.to_json(), lambda d: _queued_as_batches(edit, d)))
    document = json.loads(program_json(scale))
    edit(document)
    signed = {k: v for k, v in document.items() if k != "program_id"}
    document["program_id"] = hashlib.sha256(jcs.canonicalize(signed)).hexdigest()
    with pytest.raises(InvalidInputError, match=message):
        read_program_json(json.dumps(document))


def test_a_pair_says_as_many_queued_requests_as_its_batches_hold(scale: ScalePlan) -> None:
    text = _signed(scale.to_json(), _pair_edit(queued_requests=3))
    with pytest.raises(InvalidInputError, match=r"queued_requests is 3, but its batches hold 16"):
        ScalePlan.from_json(text)
    assert ScalePlan.from_json(scale.to_json()) == scale
    assert read_program_json(program_json(scale)).live_pairs[0].new == "new4"


def test_the_live_policies_a_document_may_name_are_the_live_methods() -> None:
    from blitzplan.live.solve import METHODS
    from blitzplan.wire.pair_rules import LIVE_POLICIES

    assert tuple(METHODS) == LIVE_POLICIES
    plan_schema, export_schema = json_schema(ScalePlan), ScaleProgram.json_schema()
    for definition in (
        plan_schema["$defs"]["LivePair"],
        json.loads(export_schema)["$defs"]["PairRecord"],
    ):
        properties = definition["properties"]
        assert properties["policy"]["enum"] == list(LIVE_POLICIES)
        assert properties["batches"]["minItems"] == properties["batches"]["items"]["minItems"] == 1


def test_a_plan_source_must_hold_what_it_sends(relayed: ScalePlan) -> None:
    document = json.loads(relayed.to_json())
    forwarded = [s for s in document["steps"] if s["holder"] == "plan"]
    assert forwarded, "the scenario must forward bytes"
    step = forwarded[0]
    feeding = [s for s in document["steps"] if s["destination"] == step["source"]]
    for s in feeding:
        document["steps"].remove(s)
        for other in document["steps"]:
            other["feeds"] = [f for f in other["feeds"] if f != s["id"]]
    document["plan_id"] = document_digest(document)
    with pytest.raises(InvalidInputError, match="neither receives in this plan|neither holds it"):
        ScalePlan.from_json(json.dumps(document))
    assert ScalePlan.from_json(relayed.to_json()) == relayed


# --- the program export ----------------------------------------------------------------------


def test_the_program_export_holds_what_a_data_plane_needs(relayed: ScalePlan) -> None:
    text = program_json(relayed)
    document = json.loads(text)
    assert document["schema"] == "blitzplan.scaleprogram" and document["schema_version"] == 1
    assert jcs.canonicalize(document) + b"\n" == text.encode()
    signed = {k: v for k, v in document.items() if k != "program_id"}
    assert hashlib.sha256(jcs.canonicalize(signed)).hexdigest() == document["program_id"]
    program = read_program_json(text)
    assert program == ScaleProgram.from_json(json.dumps(document, indent=1))
    assert program.plan_id == relayed.plan_id and program.model == relayed.model
    assert [s.id for s in program.steps] == [s.id for s in relayed.steps]
    for mine, theirs in zip(program.steps, relayed.steps, strict=True):
        assert mine.ranges == tuple(
            (r.first_unit, r.last_unit, r.offset, r.length) for r in theirs.ranges
        )
        assert (mine.source, mine.destination, mine.feeds, mine.end_s) == (
            theirs.source,
            theirs.destination,
            theirs.feeds,
            theirs.end_s,
        )
    assert program.new_instances == relayed.new_instances
    assert program.unit_bytes == relayed.multicast.unit_bytes
    assert len(text) < len(relayed.to_json()) / 2


def test_the_program_export_is_checked(relayed: ScalePlan) -> None:
    document = json.loads(program_json(relayed))
    del document["program_id"]
    with pytest.raises(InvalidInputError, match="program_id must be"):
        read_program_json(json.dumps(document))
    document = json.loads(program_json(relayed))
    document["steps"][0]["ranges"][0][3] = -1
    signed = {k: v for k, v in document.items() if k != "program_id"}
    document["program_id"] = hashlib.sha256(jcs.canonicalize(signed)).hexdigest()
    with pytest.raises(InvalidInputError, match="not inside their buffers"):
        read_program_json(json.dumps(document))
    with pytest.raises(InvalidInputError, match="not a blitzplan.scaleprogram"):
        read_program_json(relayed.to_json())


# --- the schema ------------------------------------------------------------------------------


def _properties(schema: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (name, prop, body)
        for name, definition in schema["$defs"].items()
        for prop, body in definition.get("properties", {}).items()
    ]


def test_every_property_is_described_and_null_only_where_it_means_infinity() -> None:
    schema = json_schema(ScalePlan)
    found = _properties(schema)
    assert len(found) > 200
    assert [(n, p) for n, p, body in found if not body.get("description")] == []
    step = schema["$defs"]["TransferStep"]["properties"]
    assert step["holder"]["enum"] == ["instance", "loading", "memory", "disk", "plan"]
    assert step["link"]["enum"] == ["network", "nvlink", "pcie"]
    assert step["start_s"] == {**step["start_s"], "type": "number", "minimum": 0}
    roles = schema["$defs"]["NewInstanceInfo"]["properties"]["role"]
    assert roles["enum"] == ["prefill", "decode", "colocated", "idle"]
    flows = schema["$defs"]["Flow"]["properties"]["max_bytes_per_s"]
    assert flows["type"] == ["number", "null"]


SCHEMA_PROBES: dict[str, Callable[[dict[str, Any]], None]] = {
    "holder free string": _step_edit(holder="cloud"),
    "link free string": _step_edit(link="pigeon"),
    "kind free string": _step_edit(kind="teleport"),
    "role free string": lambda d: d["new_instances"][0].update(role="boss"),
    "negative length": lambda d: d["steps"][0]["ranges"][0].update(length=-1),
    "negative offset": lambda d: d["steps"][0]["ranges"][0].update(offset=-1),
    "negative bytes": _step_edit(bytes=-1),
    "rank below -1": _step_edit(rank=-2),
    "negative start": _step_edit(start_s=-0.5),
    "null start": _step_edit(start_s=None),
    "null rate": _step_edit(rate_bytes_per_s=None),
    "stripe past 1": _step_edit(stripe=[0.0, 1.5]),
    "zero chunk": lambda d: d["options"].update(chunk_bytes=0),
    "plan_id not hex": lambda d: d.update(plan_id="xyz"),
    "hash kind unknown": lambda d: d["model"].update(hash_kind="vibes"),
    "negative unit": lambda d: d["steps"][0]["ranges"][0].update(first_unit=-1),
    "null milestone bytes": lambda d: d["multicast"].update(chunk_bytes=None),
    "string for a number": _step_edit(end_s="soon"),
    "pair policy unknown": _pair_edit(policy="vibes"),
    "pair without batches": _pair_edit(batches=[]),
    "pair with an empty batch": _pair_edit(batches=[[]]),
    "pair with an empty id": _pair_edit(batches=[[""]]),
}


@pytest.fixture(scope="module")
def small_document() -> dict[str, Any]:
    return json.loads(plan(paper_state(), ScaleRequest(MODEL, prefill=1, tp=2)).to_json())


@pytest.fixture(scope="module")
def validator() -> Any:
    return jsonschema.Draft202012Validator(json_schema(ScalePlan))


def test_the_schema_accepts_real_documents(scale: ScalePlan, validator: Any) -> None:
    validator.validate(json.loads(scale.to_json(timing=True)))


@pytest.mark.parametrize("probe", sorted(SCHEMA_PROBES))
def test_the_schema_refuses_malformed_documents(
    small_document: dict[str, Any], validator: Any, probe: str
) -> None:
    document = json.loads(json.dumps(small_document))
    assert validator.is_valid(document)
    SCHEMA_PROBES[probe](document)
    assert not validator.is_valid(document)


def test_the_shipped_export_schema_is_the_generated_one_and_validates(relayed: ScalePlan) -> None:
    from blitzplan.wire.scaleprogram import program_schema
    from blitzplan.wire.schema_fields import field_table
    from tests.conftest import REPO

    shipped = (REPO / "blitzplan" / "schemas" / "scaleprogram.v1.schema.json").read_text()
    assert shipped == ScaleProgram.json_schema()
    schema = program_schema()
    assert [(n, p) for n, p, body in _properties(schema) if not body.get("description")] == []
    assert set(field_table()) <= set(schema["$defs"]) | set(json_schema(ScalePlan)["$defs"])
    document = json.loads(program_json(relayed))
    checker = jsonschema.Draft202012Validator(schema)
    assert checker.is_valid(document)
    for edit in (
        lambda d: d["steps"][0].update(holder="cloud"),
        lambda d: d["steps"][0]["ranges"][0].__setitem__(3, -1),
        lambda d: d.update(program_id="x"),
        lambda d: d["new_instances"][0].update(role="boss"),
        lambda d: d["steps"][0].update(start_s=None),
    ):
        probe = json.loads(json.dumps(document))
        edit(probe)
        assert not checker.is_valid(probe)


def test_the_one_pass_screen_passes_valid_programs(relayed: ScalePlan, scale: ScalePlan) -> None:
    """The screen is the fast path; every probe above shows it refuses what the itemised checks
    refuse (else from_json would have passed them)."""
    from blitzplan.wire.program_rules import _spans
    from blitzplan.wire.program_screen import memory_of, screen, step_columns

    for made in (relayed, scale):
        cols = step_columns(made.steps)
        spans = tuple(map(_spans, cols["ranges"]))
        instances = {i.name: i for i in made.new_instances}
        tp, units = made.request["tp"], made.multicast.unit_bytes
        assert screen(cols, spans, tp, units, instances, made.held, memory_of(cols))


@pytest.mark.parametrize(
    "document",
    [{"b": 1, "c": "é"}, {"b": [0.1, 1e-7]}, {"z": 1}],  # the key first, non-ASCII, last
)
def test_the_digest_of_canonical_text_is_taken_on_the_text(document: dict[str, object]) -> None:
    """``signed_as_written`` hashes the canonical text without the key member: it finds the
    digest ``signed_json`` wrote, wherever the key sorts, and no digest once a byte changes."""
    from blitzplan.wire.canonical import signed_as_written, signed_json

    for key in ("a", "id", "zz"):
        text, hexdigest = signed_json(document, key)
        assert signed_as_written(text + "\n", key) == hexdigest
        changed = text.replace("1", "2", 1) if "1" in text else text.replace("é", "e")
        assert signed_as_written(changed, key) is None


def test_a_step_with_the_ranges_of_an_earlier_one_is_checked_too(relayed: ScalePlan) -> None:
    """The rules check each distinct list of ranges once: a later step with the same ranges
    and a wrong ``bytes`` is still refused."""
    document = json.loads(program_json(relayed))
    seen: set[str] = set()
    later = None
    for step in document["steps"]:
        key = json.dumps(step["ranges"])
        if key in seen:
            later = step
            break
        seen.add(key)
    assert later is not None, "the scenario must repeat a list of ranges"
    later["bytes"] += 1
    signed = {k: v for k, v in document.items() if k != "program_id"}
    document["program_id"] = hashlib.sha256(jcs.canonicalize(signed)).hexdigest()
    with pytest.raises(InvalidInputError, match=f"step {later['id']}: its ranges hold"):
        read_program_json(json.dumps(document))


def test_reading_an_export_leaves_the_garbage_collector_as_it_was(relayed: ScalePlan) -> None:
    """The reader pauses Python's cyclic collector while it builds the records, and restores
    it: enabled after a read that succeeds or fails, disabled when it was disabled."""
    import gc

    text = program_json(relayed)
    assert gc.isenabled()
    read_program_json(text)
    assert gc.isenabled()
    document = json.loads(text)
    document["steps"][0]["ranges"][0][3] = -1  # signed again in canonical form: read fast
    signed = {k: v for k, v in document.items() if k != "program_id"}
    document["program_id"] = hashlib.sha256(jcs.canonicalize(signed)).hexdigest()
    with pytest.raises(InvalidInputError, match="not inside their buffers"):
        read_program_json(jcs.canonicalize(document).decode() + "\n")
    assert gc.isenabled()
    gc.disable()
    try:
        read_program_json(text)
        assert not gc.isenabled()
    finally:
        gc.enable()
