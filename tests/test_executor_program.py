"""The executor runs ScalePlan documents from their JSON alone, over torch and NIXL, bit-exact.

The small scenario (:mod:`blitzplan.executor.program.scenarios`): TP1 sources on two hosts, three
TP2 targets, resharded sources, multi-source stripes, a forward between target nodes and NVLink
all-gathers; the live scenario adds relays (a spare GPU that stages a stripe) and a live pair.
One pool of 8 processes serves every run of the module on both transports (each NIXL run makes
its agents anew); the fault and command-line tests start and end their own, of 2 processes.
"""

from __future__ import annotations

import ast
import itertools
import json
import multiprocessing
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import blitzplan  # noqa: E402
from blitzplan import (  # noqa: E402
    ClusterState,
    InvalidInputError,
    Role,
    ScaleRequest,
    SolverUnavailableError,
    plan,
)
from blitzplan.cli import main  # noqa: E402
from blitzplan.compute import TableComputeModel  # noqa: E402
from blitzplan.executor.program.devices import BATCH, equal_chunks  # noqa: E402
from blitzplan.executor.program.runner import (  # noqa: E402
    ProgramRun,
    prepare,
    read_program,
    run_program,
)
from blitzplan.executor.runtime.failures import InjectedFault, RankFailedError  # noqa: E402
from blitzplan.executor.runtime.pool import Workers  # noqa: E402
from blitzplan.executor.runtime.worker import check_device  # noqa: E402
from blitzplan.executor.serving.serve import LOGIT_TOLERANCE, serve_live  # noqa: E402
from blitzplan.executor.transports import (  # noqa: E402
    NIXL_MODULES,
    nixl_module,
    relays,
    runs,
    writes,
)
from blitzplan.live.schedule_checks import measured_violations  # noqa: E402
from blitzplan.scale import ScalePlan  # noqa: E402
from blitzplan.scale.document import document_digest  # noqa: E402
from blitzplan.scale.export import program_json  # noqa: E402
from blitzplan.scale.scenarios import (  # noqa: E402
    scenario_plan,
    scenario_state,
)
from blitzplan.wire.program_bytes import held_bytes  # noqa: E402

PACKAGE = Path(blitzplan.__file__).parent
HAVE_NIXL = nixl_module() is not None
TRANSPORTS = [
    "torch",
    pytest.param("nixl", marks=pytest.mark.skipif(not HAVE_NIXL, reason="no NIXL")),
]


@dataclass(frozen=True)
class Setup:
    state: ClusterState
    plan: ScalePlan
    path: Path


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Setup:
    state, made = scenario_plan("small")
    root = tmp_path_factory.mktemp("program")
    path = root / "plan.json"
    path.write_text(made.to_json())
    return Setup(state, made, path)


@pytest.fixture(scope="module")
def pools() -> Iterator[list[Workers]]:
    made: list[Workers] = []
    yield made
    for workers in made:
        workers.close()
    assert multiprocessing.active_children() == []


@pytest.fixture
def pool(pools: list[Workers]) -> Workers:
    """The module's pool of 8 processes, started anew after a test whose failure ended it (so
    one failure does not fail the tests after it)."""
    if not pools or pools[-1].closed:
        pools.append(Workers([f"rank{k}" for k in range(8)], timeout_s=20.0))
    return pools[-1]


def _edited(text: str, edit: Callable[[dict[str, Any]], None], *, sign: bool = True) -> str:
    """``text`` with ``edit`` applied to its JSON; ``sign``: plan_id recomputed to match."""
    document = json.loads(text)
    edit(document)
    if sign:
        document["plan_id"] = document_digest(document)
    return json.dumps(document)


def _check_paced(run: ProgramRun, text: str) -> None:
    """Load only slows a run down: no step ends before its bytes at its pace from its earliest
    start (less one chunk's window: a chunk leaves as its window opens; a step that started late
    may catch up with its windows, never run ahead of them)."""
    program = read_program(text)
    by_id = {s.id: s for s in program.steps}
    for result in run.steps:
        step = by_id[result.id]
        if step.pace_bytes_per_s and result.program == 0:
            floor_s = (result.moved_bytes - program.chunk_bytes) / step.pace_bytes_per_s
            assert result.end_s >= 0.99 * (step.not_before_s + floor_s), result


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
    assert any(len(froms) >= 2 for froms in into.values())  # a buffer from several sources


def test_a_full_document_runs_as_its_program_export(small: Setup) -> None:
    """The executor reads a full ScalePlan as the export the planner writes (byte for byte, a
    replan and a timed document too), so both forms run the same records."""
    from blitzplan.wire.plan_program import plan_program_json

    after, _ = _replanned(small)
    for made in (small.plan, ScalePlan.from_json(after), scenario_plan("live")[1]):
        assert plan_program_json(made.to_json(timing=True)) == program_json(made)
    assert read_program(small.path) == read_program(program_json(small.plan))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_same_document_runs_bit_exact_on_both_transports(
    small: Setup, pool: Workers, transport: str
) -> None:
    text = small.path.read_text()
    run = run_program(text, workers=pool, transport=transport)
    assert run.bit_exact and run.duplicate_bytes == 0 and run.transport == transport
    assert len(run.devices) == 8 and run.plan_id == small.plan.plan_id
    step = {s.id: s for s in read_program(text).steps}
    assert all(s.moved_bytes == step[s.id].bytes for s in run.steps)
    assert not set(NIXL_MODULES) & set(sys.modules)  # only workers load NIXL (its abseil clashes)
    assert {i.name for i in run.instances} == {i.name for i in small.plan.new_instances}
    _check_paced(run, text)
    fast = run_program(text, workers=pool, transport=transport, paced=False)
    assert fast.bit_exact and fast.duplicate_bytes == 0


def test_a_lanes_writes_are_few_unpaced_and_single_chunks_paced(small: Setup) -> None:
    """Both ends of a lane hold the same writes, each one step's chunks in lane order: paced,
    one chunk each; unpaced, a step's n chunks in ceil(n / BATCH) writes of equal sizes (to a
    chunk), and some unpaced write's chunks are not contiguous in the arena (packed)."""
    for paced in (True, False):
        _, jobs = prepare(small.path, paced=paced)
        into = {(lane.peer, job.rank): lane for job in jobs for lane in job.into}
        sizes: dict[int, list[int]] = {}
        for job in jobs:
            for lane in job.out:
                assert into[(job.rank, lane.peer)].writes == lane.writes
                for write in lane.writes:
                    assert len({c.step for c in write}) == 1
                    sizes.setdefault(write[0].step, []).append(len(write))
        for counts in sizes.values():
            n = sum(counts)
            assert len(counts) == (n if paced else -(-n // BATCH))
            assert max(counts) - min(counts) <= 1
    gaps = [
        a.src + a.nbytes != b.src or a.dst + a.nbytes != b.dst
        for job in jobs
        for lane in job.out
        for write in lane.writes
        for a, b in itertools.pairwise(write)
    ]
    assert any(gaps) and not all(gaps)


def test_a_relay_forwards_a_write_from_where_it_landed(small: Setup) -> None:
    """torch: a device's write that carries the bytes of a write it receives, in the same order,
    is sent from the buffer that one landed in (no packing): matched byte for byte, and the small
    scenario's forwarding GPUs have such writes of several runs (which would be packed)."""
    _, jobs = prepare(small.path, paced=False)
    packed = 0
    for job in jobs:
        landed, found = {id(w): w for w in writes(job.into)}, relays(job.out, job.into)
        for write in writes(job.out):
            same = [k for k, w in landed.items() if runs(w, "lo") == runs(write, "held")]
            assert found.get(id(write)) in same if same else id(write) not in found
            packed += bool(same) and len(runs(write, "src")) > 1
    assert packed > 0


def test_a_colocated_plan_runs_bit_exact(small: Setup, pool: Workers, tmp_path: Path) -> None:
    """The small scenario with its TP1 sources colocated replicas, three new colocated TP2
    replicas: plan()'s document runs bit-exact from the replicas' buffers."""
    state = scenario_state("small", small.plan.spec)
    for inst in state.instances:
        if inst.tp == 1:
            state.update_instance(inst.id, role=Role.COLOCATED)
    chunk = read_program(small.path).chunk_bytes
    request = ScaleRequest(small.plan.spec, colocated=3, tp=2)
    made = plan(state, request, link_efficiency=1.0, chunk_bytes=chunk)
    assert {i.role for i in made.new_instances} == {"colocated"}
    run = run_program(made.to_json(), workers=pool)
    assert run.bit_exact and run.duplicate_bytes == 0 and len(run.devices) == 8
    assert {i.name for i in run.instances} == {i.name for i in made.new_instances}


def _replanned(small: Setup) -> tuple[str, float]:
    source = next(i.id for i in small.state.instances if i.gpus == ("h2/gpu3",))
    at_s = 0.5 * max(i.ready_at_s for i in small.plan.new_instances)
    return blitzplan.replan(small.plan, small.state, at_s=at_s, failed=[source]).to_json(), at_s


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_running_program_takes_a_replan_and_ends_bit_exact(
    small: Setup, pool: Workers, transport: str
) -> None:
    """Half-way through, the serving source on h2/gpu3 fails; the replan takes over: the old
    steps deliver what the replan holds and stop, the replan's steps send the rest, each byte
    arrives once, every new GPU ends bit-exact. Pairs then carry steps of both programs in one
    lane, and some send both ways: chunks match by the lane's order alone (one tag, as NCCL)."""
    after, at_s = _replanned(small)
    replan = read_program(after)
    held = sum(
        hi - lo
        for units in held_bytes(replan.held, replan.unit_bytes).values()
        for spans in units.values()
        for lo, hi in spans
    )
    assert held > 0 and all(s.source != "h2/gpu3" for s in replan.steps)
    _, jobs = prepare(small.path, replan=after, at_s=at_s)
    lanes = {(job.rank, lane.peer): lane for job in jobs for lane in job.out}
    assert any(len({c.step for c in lane.chunks}) > 1 for lane in lanes.values())
    assert any((b, a) in lanes for a, b in lanes)  # a pair sending both ways
    run = run_program(small.path, replan=after, at_s=at_s, workers=pool, transport=transport)
    assert run.bit_exact and run.duplicate_bytes == 0
    gpus = [g for i in replan.new_instances for g in i.gpus]
    assert run.moved_bytes == len(gpus) * sum(replan.unit_bytes)  # every byte once
    first = [s for s in run.steps if s.program == 0]
    assert sum(s.moved_bytes for s in first) == held  # the old steps stopped at held
    assert all(s.start_s >= at_s - 1e-9 for s in run.steps if s.program == 1)


def test_a_replan_claiming_bytes_never_delivered_is_refused(small: Setup) -> None:
    """The running program, less one step into a GPU the replan says holds its bytes: the
    replan would leave a hole there, and is refused before any process starts."""
    after, at_s = _replanned(small)
    replan = read_program(after)
    held = held_bytes(replan.held, replan.unit_bytes)
    steps = json.loads(small.path.read_text())["steps"]
    sources = {s["source"] for s in steps}
    dropped = next(
        s
        for s in steps
        if s["destination"] in held
        and s["destination"] not in sources
        and s["ranges"][0]["first_unit"] in held[s["destination"]]
    )

    def drop(document: dict[str, Any]) -> None:
        document["steps"] = [s for s in document["steps"] if s["id"] != dropped["id"]]

    gpu = dropped["destination"]
    before = set(multiprocessing.active_children())
    with pytest.raises(InvalidInputError, match=f"'{gpu}' would end without bytes .* of unit"):
        run_program(_edited(small.path.read_text(), drop), replan=after, at_s=at_s)
    with pytest.raises(InvalidInputError, match="replan and at_s go together"):
        run_program(small.path, replan=after)
    assert set(multiprocessing.active_children()) == before


def test_a_replan_that_changes_a_devices_buffer_is_refused(small: Setup) -> None:
    """A device keeps its buffer across a replan: serving GPUs the replan says hold TP2 rank
    buffers (TP1 in the running program) are refused before any process starts."""
    after, at_s = _replanned(small)

    def relayout(document: dict[str, Any]) -> None:
        for step in document["steps"]:
            if step["source_layout"] == [1, 0]:
                step["source_layout"] = [2, 0]

    message = r"replan loads '.*' as the buffer of \(tp, rank\) \(2, 0\), the running program as"
    with pytest.raises(InvalidInputError, match=message + r" .* \(1, 0\); a device keeps"):
        prepare(small.path, replan=_edited(after, relayout), at_s=at_s)


def test_after_store_and_forward_and_startup_are_kept(small: Setup, pool: Workers) -> None:
    def edit(document: dict[str, Any]) -> None:
        steps = {s["id"]: s for s in document["steps"]}
        steps[1]["after"] = [0]  # both sent by h0/gpu0
        steps[3]["store_and_forward"] = True  # fed by step 0
        steps[2]["not_before_s"] = 0.05

    run = run_program(_edited(small.path.read_text(), edit), workers=pool)
    step = {s.id: s for s in run.steps}
    assert run.bit_exact
    assert step[1].start_s >= step[0].sent_s
    assert step[3].start_s >= step[0].end_s  # step 0's last byte in at step 3's source
    assert step[2].start_s >= 0.05


@pytest.fixture(scope="module")
def sliced(small: Setup) -> str:
    """The small scenario planned by ``exact`` (3 TP2 instances, 32 KiB chunks), whose time
    slices make steps wait (``after``) for steps other devices send."""
    request = ScaleRequest(small.plan.spec, prefill=3, tp=2)
    options = {"link_efficiency": 1.0, "chunk_bytes": 32 * 1024, "time_limit_s": 2.0}
    return program_json(plan(small.state, request, method="exact", **options))


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_step_waits_for_steps_other_devices_send(
    sliced: str, pool: Workers, transport: str
) -> None:
    by_id = {s.id: s for s in read_program(sliced).steps}
    waits = [(s.id, a) for s in by_id.values() for a in s.after if by_id[a].source != s.source]
    third = [(k, a) for k, a in waits if by_id[k].source != by_id[a].destination]
    assert third, "the exact plan no longer has a step waiting for a third device's step"
    run = run_program(sliced, transport=transport, workers=pool)
    step = {s.id: s for s in run.steps}
    assert run.bit_exact
    late = [(k, a) for k, a in waits if step[k].start_s < step[a].end_s]
    assert not late, [(k, step[k].start_s, a, step[a].end_s) for k, a in late[:3]]


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_host_memory_and_disk_sources_hold_every_rank(
    small: Setup, pool: Workers, transport: str
) -> None:
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
    assert any(s.rank == -1 and s.holder == "disk" for s in made.steps)
    run = run_program(made.to_json(), workers=pool, transport=transport)
    assert run.bit_exact and run.duplicate_bytes == 0


COMPUTE = TableComputeModel(
    prefill_tokens=[16, 256],
    prefill_s=[3e-4, 2e-3],
    decode_batch_sizes=[1],
    decode_context_lens=[0],
    decode_s=[[3e-4]],
    head_tokens=[1],
    head_s=[1e-4],
)


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_a_live_pair_is_served_from_the_document(
    pool: Workers, tmp_path: Path, transport: str
) -> None:
    """The live scenario's document (relays included) runs and its live pair is served: the new
    instance computes on layers as they land, every request's logits equal the monolithic
    model's, the measured operations obey the rules, every byte is bit-exact."""
    state, made = scenario_plan("live", compute=COMPUTE)
    document = json.loads(made.to_json())
    assert any(s["instance"] is None for s in document["steps"])  # a relay stages a stripe
    assert document["live_pairs"][0]["new"] == "new0"
    requests = {q.id: q.prompt_tokens for i in state.instances for q in i.queue}
    run = serve_live(
        made.to_json(),
        requests=requests,
        compute=COMPUTE,
        workers=pool,
        transport=transport,
    )
    assert run.transfer.bit_exact and run.max_abs_logit_diff <= LOGIT_TOLERANCE
    assert measured_violations(run) == ()
    assert len(run.predicted_s) == len(run.completion_s) == len(requests)


def test_a_live_pair_naming_no_new_instance_is_refused_by_the_reader(tmp_path: Path) -> None:
    _, made = scenario_plan("live", compute=COMPUTE)
    text = _edited(made.to_json(), lambda d: d["live_pairs"][0].update(new="new9"))
    with pytest.raises(InvalidInputError, match=r"live_pairs\[0\]\.new is 'new9', no live new"):
        serve_live(text, requests={}, compute=COMPUTE)


def _tiny_plan(small: Setup) -> str:
    """AllCache's plan of one TP1 instance: host memory to one GPU, 2 processes."""
    state = ClusterState(small.state.topology, models=[small.plan.spec])
    made = blitzplan.plan(
        state,
        ScaleRequest(small.plan.spec, prefill=1, tp=1),
        method="allcache",
        link_efficiency=1.0,
    )
    return made.to_json()


@pytest.mark.parametrize(
    ("transport", "rank", "label"),
    [("torch", 0, r"h\d/mem"), pytest.param("nixl", 1, r"h\d/gpu\d", marks=TRANSPORTS[1].marks)],
    ids=["torch-source-dies", "nixl-receiver-dies"],
)
def test_a_dead_peer_is_named_with_its_step_and_chunk(
    small: Setup, transport: str, rank: int, label: str
) -> None:
    """Host memory (rank 0, it only sends) or the GPU (rank 1, it only receives) dies as it
    moves layer 2; the run stops naming the rank, the unit, the step and the chunk, and no
    process is left."""
    before = set(multiprocessing.active_children())
    fault = InjectedFault(rank=rank, layer=2)
    message = rf"rank {rank} \({label}\) died .* at unit 2 \(step 0, chunk \[0, \d+\)\)"
    with pytest.raises(RankFailedError, match=message) as caught:
        run_program(_tiny_plan(small), fault=fault, timeout_s=5.0, transport=transport)
    assert (caught.value.layer, caught.value.step) == (2, 0)
    assert set(multiprocessing.active_children()) == before


def test_a_fault_that_could_never_fire_is_refused_before_the_run(small: Setup) -> None:
    before = set(multiprocessing.active_children())
    with pytest.raises(InvalidInputError, match="fault names rank 9, the run has 2 devices"):
        run_program(_tiny_plan(small), fault=InjectedFault(9, 1))
    with pytest.raises(InvalidInputError, match="never moves it .* the fault could never fire"):
        run_program(_tiny_plan(small), fault=InjectedFault(1, 99))
    assert set(multiprocessing.active_children()) == before


def test_the_command_runs_a_document_over_nixl(
    small: Setup, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "tiny.json"
    path.write_text(_tiny_plan(small))
    transport = "nixl" if HAVE_NIXL else "torch"
    argv = ["validate", "--plan", str(path)]
    assert main([*argv, "--transport", transport, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bit_exact"] is True and report["processes"] == 2
    assert report["transport"] == transport


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--plan", "x.json", "--program", "small"], "give one of"),
        (["--plan", "x.json"], "document 'x.json' is not a file"),
        (["--program", "huge"], "scenario must be one of small, large, live"),
        (["--program", "small", "--transport", "mpi"], "transport must be one of torch, nixl"),
    ],
)
def test_the_command_refuses_what_cannot_run(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = set(multiprocessing.active_children())
    assert main(["validate", *argv]) == 2
    assert message in capsys.readouterr().err
    assert set(multiprocessing.active_children()) == before


def _bad_cases() -> dict[str, tuple[Any, ...]]:
    def step(k: int, **fields: Any) -> Callable[[dict[str, Any]], None]:
        return lambda d: d["steps"][k].update(fields)

    return {
        "not json": (lambda t: t[:-20], "does not parse"),
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
        "no steps": (lambda t: _edited(t, lambda d: d.update(steps=[])), "nothing to run"),
        "device": (lambda t: t, "device must be one of", "tpu"),
    }


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
        "no steps",
        "device",
    ],
)
def test_a_bad_document_is_refused_before_anything_starts(small: Setup, case: str) -> None:
    edit, message, *rest = _bad_cases()[case]
    device = rest[0] if rest else "cpu"
    before = set(multiprocessing.active_children())
    with pytest.raises(InvalidInputError, match=message):
        run_program(edit(small.path.read_text()), device=device)
    assert set(multiprocessing.active_children()) == before


def _source(module: str) -> Path:
    base = PACKAGE.parent / module.replace(".", "/")
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _imports(module: str) -> list[str]:
    """Every module ``module`` imports (at the top or inside a function)."""
    tree = ast.parse(_source(module).read_text())
    found = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
    return found + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]


def test_the_executor_reads_only_the_json() -> None:
    """What runs a document (run_program and every executor module it reaches, live serving
    too) imports nothing of the planner (blitzplan.scale, blitzplan.multicast)."""
    seen, todo, planner = (
        set(),
        ["blitzplan.executor.program.runner", "blitzplan.executor.serving.serve"],
        [],
    )
    while todo:
        module = todo.pop()
        if module in seen or not _source(module).is_file():
            continue
        seen.add(module)
        for name in _imports(module):
            if name.startswith(("blitzplan.scale", "blitzplan.multicast")):
                planner.append((module, name))
            elif name.startswith("blitzplan.executor."):
                todo.append(name)
    assert {
        "blitzplan.executor.program.session",
        "blitzplan.executor.transports.nixl_write",
    } <= seen
    assert planner == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_the_program_runs_with_buffers_on_the_gpu(small: Setup, transport: str) -> None:
    run = run_program(small.path, device="cuda", transport=transport)
    assert run.bit_exact and run.duplicate_bytes == 0


def test_a_forwarded_write_waits_for_the_writes_that_bring_its_bytes(small: Setup) -> None:
    """Certificate: every byte a device sends that it lacks at the start is in a write it
    receives that the send waits for (and each such write brings a byte of it); every new GPU
    of the plan ends whole, with no byte twice; the small scenario forwards."""
    from blitzplan.wire.program_bytes import subtract, union

    _, jobs = prepare(small.path, paced=False)
    waiting = 0
    for job in jobs:
        received = [runs(w, "lo") for w in writes(job.into)]
        for write, need in zip(writes(job.out), job.needs, strict=True):
            brought = [r for k in need for r in received[k]]
            for unit, lo, hi in runs(write, "held"):
                have = [(0, job.sizes[unit])] if job.filled else job.held.get(unit, [])
                for gap in subtract((lo, hi), have):
                    spans = union((a, b) for u, a, b in brought if u == unit)
                    assert subtract(gap, spans) == [], (job.label, unit, gap)
            held = runs(write, "held")
            for k in need:  # each brings a byte of it
                assert any(
                    u == v and a < hi and b > lo for u, a, b in received[k] for v, lo, hi in held
                )
            waiting += bool(need)
        if job.check:
            assert all(job.whole) and job.duplicate_bytes == 0
    assert waiting > 0


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


def test_a_device_is_checked() -> None:
    assert check_device("cpu", 8) == "gloo"
    with pytest.raises(InvalidInputError, match="device must be one of cpu, cuda, got 'tpu'"):
        check_device("tpu", 8)


@pytest.mark.parametrize(
    ("installed", "cuda", "chosen"),
    [
        ((), "13.0", None),
        (("nixl_cu12",), None, "nixl_cu12"),
        (("nixl_cu12", "nixl_cu13"), None, "nixl_cu12"),
        (("nixl_cu12", "nixl_cu13"), "13.0", "nixl_cu13"),
        (("nixl_cu12", "nixl_cu13"), "12.8", "nixl_cu12"),
        (("nixl_cu13",), "12.8", "nixl_cu13"),
    ],
)
def test_nixl_is_the_build_for_torchs_cuda_else_one_installed(
    monkeypatch: pytest.MonkeyPatch,
    installed: tuple[str, ...],
    cuda: str | None,
    chosen: str | None,
) -> None:
    """NIXL's builds are one per CUDA major (nixl-cu12, nixl-cu13): the one matching torch's
    CUDA is loaded; without that one (or without CUDA) the first installed; none, None."""
    import importlib.util

    import blitzplan.executor.transports as transports

    real = importlib.util.find_spec

    def find_spec(name: str, *rest: Any) -> object:
        return (name in installed or None) if name in NIXL_MODULES else real(name, *rest)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    monkeypatch.setattr(torch.version, "cuda", cuda)
    assert transports.nixl_module() == chosen
    if chosen is None:
        with pytest.raises(SolverUnavailableError, match="transport 'nixl' needs NIXL"):
            transports.check_transport("nixl")
