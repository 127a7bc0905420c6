"""The program export's reader refuses every malformed probe the full document's reader
refuses, on its fast path (canonical text, decoded straight into records, rules checked over
columns) and on its itemised path (re-formatted text), with the same message."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any

import pytest

from blitzplan import InvalidInputError
from blitzplan.scale import ScalePlan, ScaleRequest, plan
from blitzplan.scale.export import program_json
from blitzplan.wire.canonical import canonical_json
from blitzplan.wire.plan_program import plan_program_json
from blitzplan.wire.scaleprogram import read_program_json
from tests.test_documents import PROGRAM_PROBES, _signed
from tests.test_scale import MODEL, paper_state

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture(scope="module")
def scale() -> ScalePlan:
    return plan(paper_state(), ScaleRequest(MODEL, prefill=6, decode=1, tp=2))


def _both_forms(document: dict[str, Any]) -> tuple[str, str]:
    """The export signed again: as canonical text (read fast) and indented (read item by
    item)."""
    document.pop("program_id", None)
    document["program_id"] = hashlib.sha256(canonical_json(document).encode()).hexdigest()
    return canonical_json(document) + "\n", json.dumps(document, indent=1)


def _first(document: dict[str, Any], edit: Edit) -> None:
    edit(document["steps"][0])


EXPORT_PROBES: dict[str, tuple[Edit, str]] = {
    "source is its destination": (
        lambda d: _first(d, lambda s: s.update(source=s["destination"])),
        "source and destination are both",
    ),
    "rank -1 from a GPU": (
        lambda d: _first(d, lambda s: s.update(rank=-1, instance=None)),
        "rank -1 .* needs a host-memory source",
    ),
    "another GPU of its instance": (
        lambda d: _first(d, lambda s: s.update(rank=1 - s["rank"])),
        "is not rank",
    ),
    "empty stripe": (
        lambda d: _first(d, lambda s: s.update(stripe=[0.5, 0.5])),
        r"stripe \[0.5, 0.5\] is not",
    ),
    "negative pace": (
        lambda d: _first(d, lambda s: s.update(pace_bytes_per_s=-1.0)),
        "pace_bytes_per_s must be > 0",
    ),
    "feed into another device": (
        lambda d: _first(d, lambda s: s.update(feeds=[d["steps"][-1]["id"]])),
        "which does not bring bytes to its source",
    ),
    "waits for itself": (
        lambda d: _first(d, lambda s: s.update(after=[s["id"]])),
        "which is not another step",
    ),
    "unknown kind": (lambda d: _first(d, lambda s: s.update(kind="teleport")), "kind must be"),
    "plan source that receives nothing": (
        lambda d: _first(d, lambda s: s.update(holder="plan", source="h9/gpu9")),
        "source 'h9/gpu9' is unknown",
    ),
    "serving source that also receives": (
        lambda d: d["steps"][-1].update(source=d["steps"][0]["destination"], holder="instance"),
        "is a 'instance' holder but also receives",
    ),
}


@pytest.mark.parametrize("probe", sorted(PROGRAM_PROBES))
def test_the_export_reader_refuses_what_from_json_refuses(scale: ScalePlan, probe: str) -> None:
    edit, message = PROGRAM_PROBES[probe]
    document = json.loads(plan_program_json(_signed(scale.to_json(), edit)))
    for text in _both_forms(document):
        with pytest.raises(InvalidInputError, match=message):
            read_program_json(text)


@pytest.mark.parametrize("probe", sorted(EXPORT_PROBES))
def test_the_column_checks_refuse_each_rule(scale: ScalePlan, probe: str) -> None:
    edit, message = EXPORT_PROBES[probe]
    document = json.loads(program_json(scale))
    for text in _both_forms(json.loads(json.dumps(document))):
        read_program_json(text)  # the unedited export reads, either way
    edit(document)
    for text in _both_forms(document):
        with pytest.raises(InvalidInputError, match=message):
            read_program_json(text)


def test_a_tampered_or_unsigned_export_is_refused(scale: ScalePlan) -> None:
    text = program_json(scale)
    changed = text.replace('"rank":0', '"rank":1', 1)
    assert changed != text
    with pytest.raises(InvalidInputError, match="does not match the document"):
        read_program_json(changed)
    document = json.loads(text)
    del document["program_id"]
    with pytest.raises(InvalidInputError, match="program_id must be"):
        read_program_json(canonical_json(document))
