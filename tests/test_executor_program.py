"""The torch executor runs a ScalePlan document's transfer program from its JSON alone.

The small scenario (:mod:`blitzplan.executor.program_scenario`): TP1 sources on two hosts, three
TP2 targets, resharded sources, multi-source stripes, a forward between target nodes and NVLink
all-gathers, planned with ``blitzplan.plan`` and run by 8 processes over gloo. One pool of
processes serves every run of the module; the command-line test starts and ends its own.
"""

from __future__ import annotations

import ast
import json
import math
import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

import blitzplan  # noqa: E402
from blitzplan import ClusterState, InvalidInputError, ScaleRequest, load_model  # noqa: E402
from blitzplan.executor.checkpoint import Checkpoint, save_checkpoint  # noqa: E402
from blitzplan.executor.cli import main  # noqa: E402
from blitzplan.executor.faults import InjectedFault, RankFailedError  # noqa: E402
from blitzplan.executor.model import small_config  # noqa: E402
from blitzplan.executor.processes import Workers  # noqa: E402
from blitzplan.executor.program import run_program  # noqa: E402
from blitzplan.executor.program_doc import document_digest, read_program  # noqa: E402
from blitzplan.executor.program_result import ProgramRun  # noqa: E402
from blitzplan.executor.program_scenario import scenario_plan  # noqa: E402
from blitzplan.executor.program_store import Coverage  # noqa: E402
from blitzplan.executor.program_timeline import program_timeline  # noqa: E402
from blitzplan.executor.waiting import equal_chunks  # noqa: E402
from blitzplan.executor.worker import check_device  # noqa: E402
from blitzplan.scale import ScalePlan  # noqa: E402

PACKAGE = Path(blitzplan.__file__).parent


@dataclass(frozen=True)
class Setup:
    state: ClusterState
    plan: ScalePlan
    path: Path
    weights: Checkpoint


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    state, made = scenario_plan("small")
    root = tmp_path_factory.mktemp("program")
    path = root / "plan.json"
    path.write_text(made.to_json())
    return Setup(state, made, path, save_checkpoint(made.spec, root / "weights", seed=1))


@pytest.fixture(scope="module")
def pool() -> Iterator[Workers]:
    with Workers([f"rank{k}" for k in range(8)], timeout_s=20.0, backend="gloo") as workers:
        yield workers
    assert multiprocessing.active_children() == []


def _edited(text: str, edit: Callable[[dict[str, Any]], None], *, sign: bool = True) -> str:
    """``text`` with ``edit`` applied to its JSON; ``sign``: plan_id recomputed to match."""
    document = json.loads(text)
    edit(document)
    if sign:
        document["plan_id"] = document_digest(document)
    return json.dumps(document)


def _check_timing(run: ProgramRun) -> None:
    """Gross errors only: the machine is shared, the bound is twice the plan's whole time."""
    bound = 2 * run.plan_s
    errors = [*run.start_errors_s().values(), *run.end_errors_s().values()]
    errors += [e for per in run.ready_errors_s().values() for e in per]
    assert max(abs(e) for e in errors) < bound, (errors, bound)


def test_the_small_plan_has_every_feature_the_executor_must_run(small: Setup) -> None:
    steps = json.loads(small.path.read_text())["steps"]
    kinds = {s["kind"] for s in steps}
    assert {"network", "allgather", "device_to_device"} <= kinds
    assert {len(i.gpus) for i in small.plan.new_instances} == {2}  # TP2 targets
    assert any(s["source_layout"] == [1, 0] for s in steps)  # TP1 sources resharded
    assert any(s["holder"] == "plan" and s["kind"] == "network" for s in steps)  # a forward
    assert any(s["kind"] == "network" and s["stripe"] != [0.0, 1.0] for s in steps)  # stripes
    into: dict[str, set[str]] = {}
    for s in steps:
        into.setdefault(s["destination"], set()).add(s["source"])
    sources_of = {s["source"] for s in steps if s["holder"] == "instance"}
    assert len({g.split("/")[0] for g in sources_of}) == 2  # sources on two hosts
    assert any(len(froms) >= 2 for froms in into.values())  # a buffer from several sources


def test_the_plans_predictions_follow_its_own_program(small: Setup) -> None:
    """The document's start_s/end_s agree with its steps run on paper by their own rules
    (program_timeline), to within one chunk's window at the step's pace."""
    program = read_program(small.path)
    rules = program_timeline(program)
    assert set(rules) == {s.id for s in program.steps}
    for step in program.steps:
        window = program.chunk_bytes / (step.pace_bytes_per_s or math.inf)
        start, end = rules[step.id]
        assert abs(start - step.start_s) <= window and abs(end - step.end_s) <= window, step.id


def test_the_program_runs_from_json_bit_exact_near_the_plan(small: Setup, pool: Workers) -> None:
    run = run_program(small.path, small.weights, workers=pool)
    assert run.bit_exact and run.duplicate_bytes == 0
    assert len(run.devices) == 8 and run.plan_id == small.plan.plan_id
    assert all(s.moved_bytes == s.bytes for s in run.steps)
    assert {i.name for i in run.instances} == {i.name for i in small.plan.new_instances}
    _check_timing(run)


def test_a_replan_moves_only_what_remains(small: Setup, pool: Workers) -> None:
    source = next(i.id for i in small.state.instances if i.gpus == ("h2/gpu3",))
    after = blitzplan.replan(
        small.plan,
        small.state,
        at_s=0.5 * max(i.ready_at_s for i in small.plan.new_instances),
        failed=[source],
    )
    text = after.to_json()
    program = read_program(text)
    held = sum(hi - lo for spans in program.held.values() for _, lo, hi in spans)
    assert held > 0 and all(s.source != "h2/gpu3" for s in program.steps)
    run = run_program(text, small.weights, workers=pool)
    assert run.bit_exact and run.duplicate_bytes == 0
    gpus = [g for i in program.new_instances for g in i.gpus]
    assert run.moved_bytes == sum(s.bytes for s in program.steps)
    assert run.moved_bytes + held == len(gpus) * sum(program.unit_bytes)  # each byte once
    assert run.moved_bytes < sum(s.bytes for s in read_program(small.path).steps)
    _check_timing(run)


def test_after_store_and_forward_and_startup_are_kept(small: Setup, pool: Workers) -> None:
    def edit(document: dict[str, Any]) -> None:
        steps = {s["id"]: s for s in document["steps"]}
        steps[1]["after"] = [0]  # both sent by h0/gpu0
        steps[3]["store_and_forward"] = True  # fed by step 0
        steps[2]["not_before_s"] = 0.05

    run = run_program(_edited(small.path.read_text(), edit), small.weights, workers=pool)
    step = {s.id: s for s in run.steps}
    assert run.bit_exact
    assert step[1].start_s >= step[0].sent_s
    assert step[3].start_s >= step[0].end_s  # step 0's last byte in at step 3's source
    assert step[2].start_s >= 0.05


def test_host_memory_and_disk_sources_hold_every_rank(small: Setup, pool: Workers) -> None:
    """ServerlessLLM's plan: the SSD fills host memory (rank -1: every rank's buffer), which
    feeds each new GPU its rank's bytes at ``rank * B_u``."""
    state = ClusterState(small.state.topology, models=[small.plan.spec])
    for inst in small.state.instances:
        state.add_instance(small.plan.spec, gpus=list(inst.gpus), role=inst.role)
    made = blitzplan.plan(
        state,
        ScaleRequest(small.plan.spec, prefill=2, tp=2),
        method="serverlessllm",
        link_efficiency=1.0,
        chunk_bytes=32 * 1024,
    )
    steps = made.steps
    assert any(s.rank == -1 and s.holder == "disk" for s in steps)
    assert any(s.kind == "host_to_device" and s.rank == 1 for s in steps)
    run = run_program(made.to_json(), small.weights, workers=pool)
    assert run.bit_exact and run.duplicate_bytes == 0


def test_the_command_writes_a_document_and_runs_it(
    small: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(multiprocessing.active_children())
    out, weights = tmp_path / "small.json", tmp_path / "weights"
    args = ["validate", "--plan-scenario", "small", "--plan-out", str(out)]
    assert main([*args, "--checkpoint", str(weights)]) == 0
    assert json.loads(out.read_text())["plan_id"] == small.plan.plan_id  # deterministic
    capsys.readouterr()
    assert main(["validate", "--plan", str(out), "--checkpoint", str(weights), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"] is True and report["processes"] == 8
    assert report["errors_s"]["end"]["worst"] < 2 * report["plan_s"]
    assert set(multiprocessing.active_children()) == before


def test_a_source_that_dies_is_named_and_every_process_ends(small: Setup) -> None:
    """AllCache's plan (host memory to four GPUs, 5 processes): the memory dies as it starts
    sending layer 2; the run stops naming it, and no process is left."""
    state = ClusterState(small.state.topology, models=[small.plan.spec])
    made = blitzplan.plan(
        state,
        ScaleRequest(small.plan.spec, prefill=2, tp=2),
        method="allcache",
        link_efficiency=1.0,
    )
    before = set(multiprocessing.active_children())
    fault = InjectedFault(rank=0, layer=2, kind="die")
    with pytest.raises(RankFailedError, match=r"rank 0 \(h\d/mem\) died .* layer 2") as caught:
        run_program(made.to_json(), small.weights, fault=fault, timeout_s=5.0)
    assert caught.value.layer == 2
    assert set(multiprocessing.active_children()) == before


def test_the_program_option_writes_then_runs_from_the_file(
    small: Setup, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--program`` writes the scenario's document and weights, then runs the file it wrote
    (the run itself is the ``--plan`` path, run for real above)."""
    import blitzplan.executor.program_cli as program_cli

    ran: list[tuple[Path, Path]] = []
    monkeypatch.setattr(
        program_cli, "_run", lambda path, weights, args: ran.append((path, weights)) or 0
    )
    out, weights = tmp_path / "doc.json", tmp_path / "w"
    assert (
        main(
            ["validate", "--program", "small", "--plan-out", str(out), "--checkpoint", str(weights)]
        )
        == 0
    )
    assert ran == [(out, weights)] and (weights / "manifest.json").is_file()
    assert read_program(out).plan_id == small.plan.plan_id


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plan", "x.json"], "--plan needs --checkpoint"),
        (["--plan-scenario", "small"], "--plan-scenario needs --plan-out"),
        (["--plan", "x.json", "--program", "small"], "give one of"),
        (["--program", "huge"], "scenario must be one of small, large"),
    ],
)
def test_the_program_options_refuse_what_cannot_run(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(multiprocessing.active_children())
    assert main(["validate", *argv]) == 2
    assert message in capsys.readouterr().err
    assert set(multiprocessing.active_children()) == before


def _bad_cases(weights: Checkpoint, other: Checkpoint) -> dict[str, tuple[Any, ...]]:
    def step(k: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: d["steps"][k].update(fields)

    return {
        "not json": (lambda t: t[:-20], "not JSON"),
        "version": (lambda t: _edited(t, lambda d: d.update(schema_version=1)), "schema_version 1"),
        "edited": (lambda t: _edited(t, step(0, bytes=1), sign=False), "plan_id .* does not match"),
        "type": (lambda t: _edited(t, step(0, rank="x")), r"\$\.steps\[0\]\.rank"),
        "range": (
            lambda t: _edited(
                t,
                step(
                    0,
                    ranges=[{"first_unit": 0, "last_unit": 0, "offset": 10**9, "length": 1}],
                    bytes=1,
                ),
            ),
            "step 0: bytes .* not inside",
        ),
        "unknown device": (lambda t: _edited(t, step(3, source="h9/gpu0")), "'h9/gpu0' is unknown"),
        "unknown instance": (lambda t: _edited(t, step(0, instance="new9")), "'new9' is not a new"),
        "after": (lambda t: _edited(t, step(2, after=[0])), "after step 0 is not supported"),
        "no steps": (lambda t: _edited(t, lambda d: d.update(steps=[])), "nothing to run"),
        "weights": (lambda t: t, "refusing to mix weights", other),
        "device": (lambda t: t, "device must be one of", weights, "tpu"),
    }


@pytest.fixture(scope="module")
def other_weights(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    spec = load_model(
        small_config(
            num_layers=2,
            hidden_size=64,
            intermediate_size=128,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=128,
        )
    )
    return save_checkpoint(spec, tmp_path_factory.mktemp("other"), seed=1)


@pytest.mark.parametrize(
    "case",
    [
        "not json",
        "version",
        "edited",
        "type",
        "range",
        "unknown device",
        "unknown instance",
        "after",
        "no steps",
        "weights",
        "device",
    ],
)
def test_a_bad_document_is_refused_before_anything_starts(
    small: Setup, other_weights: Checkpoint, case: str
) -> None:
    edit, message, *rest = _bad_cases(small.weights, other_weights)[case]
    weights = rest[0] if rest else small.weights
    device = rest[1] if len(rest) > 1 else "cpu"
    before = set(multiprocessing.active_children())
    with pytest.raises(InvalidInputError, match=message):
        run_program(edit(small.path.read_text()), weights, device=device)
    assert set(multiprocessing.active_children()) == before


def _imports(module: str) -> list[str]:
    """Every module ``module`` imports (at the top or inside a function)."""
    tree = ast.parse((PACKAGE.parent / (module.replace(".", "/") + ".py")).read_text())
    found = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    return found + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def test_the_executor_reads_only_the_json() -> None:
    """What runs a document (run_program and every executor module it reaches) imports nothing
    of the planner (blitzplan.scale, blitzplan.multicast): the document is the whole contract."""
    seen, todo, planner = set(), ["blitzplan.executor.program"], []
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        for name in _imports(module):
            if name.startswith(("blitzplan.scale", "blitzplan.multicast")):
                planner.append((module, name))
            elif name.startswith("blitzplan.executor."):
                todo.append(name)
    assert "blitzplan.executor.program_worker" in seen and "blitzplan.executor.worker" in seen
    assert planner == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_the_program_runs_with_buffers_on_the_gpu(small: Setup) -> None:
    run = run_program(small.path, small.weights, device="cuda")
    assert run.bit_exact and run.duplicate_bytes == 0


@given(
    st.integers(1, 300),
    st.lists(st.tuples(st.integers(0, 299), st.integers(1, 60)), max_size=25),
    st.tuples(st.integers(0, 299), st.integers(1, 300)),
)
def test_coverage_counts_every_byte_once(
    size: int, pieces: list[tuple[int, int]], query: tuple[int, int]
) -> None:
    """Property: after any pieces arrive, the present bytes are their union, the duplicates the
    rest, the buffer is complete exactly when the union covers it, and ``since`` of a range is
    the latest arrival among the pieces covering it (None when a byte is missing)."""
    cover, have, times = Coverage(size), [0] * size, [0.0] * size
    total = 0
    for k, (lo, n) in enumerate(pieces):
        lo, hi = min(lo, size - 1), min(lo + n, size)
        cover.add(lo, hi, float(k))
        total += hi - lo
        for b in range(lo, hi):
            have[b] += 1
            times[b] = float(k)
    union = sum(1 for h in have if h)
    assert cover.present_bytes == union and cover.duplicate_bytes == total - union
    assert (cover.complete_s is not None) == (union == size)
    lo, hi = min(query[0], size - 1), min(query[0] + query[1], size)
    got = cover.since(lo, hi)
    if all(have[lo:hi]):
        overlapped = not all(h <= 1 for h in have)
        assert got is not None and (overlapped or got == max(times[lo:hi]))
    else:
        assert got is None


@given(st.integers(0, 1000), st.integers(0, 5000), st.integers(1, 700))
def test_equal_chunks_tile_the_range(lo: int, size: int, chunk: int) -> None:
    """Property: the chunks tile ``[lo, lo + size)`` in order, none over ``chunk`` bytes, and
    they differ in size by at most one byte."""
    chunks = equal_chunks(lo, lo + size, chunk)
    assert [a for a, _ in chunks[1:]] == [b for _, b in chunks[:-1]]
    if size:
        assert chunks[0][0] == lo and chunks[-1][1] == lo + size
        sizes = [b - a for a, b in chunks]
        assert max(sizes) <= chunk and max(sizes) - min(sizes) <= 1
    else:
        assert chunks == []


def test_a_backend_can_be_asked_for_and_is_checked() -> None:
    assert check_device("cpu", 8, backend="gloo") == "gloo"
    with pytest.raises(InvalidInputError, match="backend='nccl' needs device='cuda'"):
        check_device("cpu", 8, backend="nccl")
    with pytest.raises(InvalidInputError, match="backend must be one of gloo, nccl, got 'mpi'"):
        check_device("cpu", 8, backend="mpi")
