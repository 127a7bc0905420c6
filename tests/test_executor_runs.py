"""The executor for real, on the CPU: striped multicast, live execution, faults, validate.

Each run is checked as a certificate: every unit bit-exact on every new GPU, arrivals close to the
plan's, the measured live operations obey the rules of DESIGN.md section 4 with the measured
arrivals, and every request's logits equal the monolithic model's.
"""

from __future__ import annotations

import json
import multiprocessing
import random
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from blitzplan import ClusterState, InvalidInputError, load_model  # noqa: E402
from blitzplan.compute import TableComputeModel  # noqa: E402
from blitzplan.executor.calibrate import paced_topology  # noqa: E402
from blitzplan.executor.checkpoint import Checkpoint, save_checkpoint  # noqa: E402
from blitzplan.executor.cli import main  # noqa: E402
from blitzplan.executor.faults import InjectedFault, RankFailedError  # noqa: E402
from blitzplan.executor.live import LOGIT_TOLERANCE, live_violations, run_live  # noqa: E402
from blitzplan.executor.model import small_config  # noqa: E402
from blitzplan.executor.multicast import MulticastRun, run_multicast  # noqa: E402
from blitzplan.executor.processes import Workers  # noqa: E402
from blitzplan.executor.striped import run_striped, striped_plan  # noqa: E402
from blitzplan.live.instance import instance_from_queue  # noqa: E402
from blitzplan.live.policies import POLICIES  # noqa: E402
from blitzplan.live.schedule import Schedule  # noqa: E402
from blitzplan.multicast import MulticastPlan, plan_multicast, validate_multicast  # noqa: E402
from blitzplan.units import KIB, MB  # noqa: E402

CONFIG = small_config(
    num_layers=4,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=128,
)
RATE = 5 * MB
QUEUE = [(0.0, 48), (0.0, 32), (0.005, 64), (0.01, 40), (0.02, 56)]
LABELS = ["source", "t1", "t2", "old instance"]


def _plan(targets: int, *, live: int = 0, rate: float = RATE) -> MulticastPlan:
    spec = load_model(CONFIG)
    state = ClusterState(
        paced_topology(targets + 1, bytes_per_s=rate, latency_s=0.0), models=[spec]
    )
    state.add_instance(spec, gpus=["h0/gpu0"], role="prefill", queue=QUEUE)
    return plan_multicast(
        state,
        spec,
        targets=[[f"h0/gpu{i}"] for i in range(1, targets + 1)],
        live=live,
        chunk_bytes=64 * KIB,
    )


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> Checkpoint:
    return save_checkpoint(load_model(CONFIG), tmp_path_factory.mktemp("weights"), seed=1)


@pytest.fixture(scope="module")
def pool() -> Iterator[Workers]:
    with Workers(LABELS, timeout_s=20.0) as workers:
        yield workers
    assert multiprocessing.active_children() == []


def _check_run(run: MulticastRun) -> None:
    """Certificate: bit-exact everywhere; every instance completes its units in order."""
    assert run.layers_bit_exact
    for name, times in run.arrival_s.items():
        assert list(times) == sorted(times), name


def test_multicast_is_bit_exact_and_close_to_the_plan(pool: Workers, weights: Checkpoint) -> None:
    plan = _plan(2)
    run = run_multicast(plan, weights, workers=pool)
    _check_run(run)
    total_s = sum(plan.unit_bytes) / RATE
    for name, errors in run.arrival_errors_s().items():
        assert max(abs(e) for e in errors) < 0.5 * total_s, (name, errors)
    unpaced = run_multicast(plan, weights, workers=pool, paced=False)
    _check_run(unpaced)
    assert max(unpaced.arrival_s["new1"]) < max(run.arrival_s["new1"])


def test_striped_run_two_sources_one_node_and_a_forward(weights: Checkpoint) -> None:
    """Two sources each stream a different stripe into one node of two GPUs (two processes),
    which gathers them and forwards everything to a second node: bit-exact, near the plan."""
    state, plan = striped_plan(load_model(CONFIG))
    assert validate_multicast(state, plan) == ()
    into = {}
    for hop in plan.hops:
        into.setdefault(hop.receiver, set()).add(plan.nodes[hop.sender].kind.value)
    assert {"instance"} in [kinds for kinds in into.values() if len(kinds) == 1] or any(
        len([h for h in plan.hops if h.receiver == node]) == 2 for node in into
    )
    assert any(kinds == {"target"} for kinds in into.values())  # the forward
    assert plan.allgathers
    before = set(multiprocessing.active_children())
    run = run_striped(weights)
    _check_run(run)
    assert len(run.arrival_s) == 4
    for name, errors in run.arrival_errors_s().items():  # gross errors only: the machine is
        assert max(abs(e) for e in errors) < 2 * plan.all_ready_s, (name, errors)  # shared
    assert set(multiprocessing.active_children()) == before


def _live(policy: str, pool: Workers | None, weights: Checkpoint, **options: object):
    plan = _plan(2, live=1, rate=2 * MB)
    compute = TableComputeModel(
        prefill_tokens=[16, 64],
        prefill_s=[3e-4, 6e-4],
        decode_batch_sizes=[1],
        decode_context_lens=[0],
        decode_s=[[3e-4]],
        head_tokens=[1],
        head_s=[1e-4],
    )
    instance = instance_from_queue(
        load_model(CONFIG),
        compute,
        plan.layer_ready_s[plan.live[0]],
        QUEUE,
        handoff_bytes_per_s=1e9,
    )
    rng = random.Random(0)
    prompts = [[rng.randrange(128) for _ in range(n)] for _, n in QUEUE]
    return run_live(POLICIES[policy](), instance, plan, weights, prompts, workers=pool, **options)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_live_execution_equals_the_monolithic_model(
    pool: Workers, weights: Checkpoint, policy: str
) -> None:
    run = _live(policy, pool, weights)
    assert run.max_abs_logit_diff <= LOGIT_TOLERANCE
    assert live_violations(run) == ()
    assert run.transfer.layers_bit_exact
    assert all(c >= r for c, r in zip(run.completion_s, run.release_s, strict=True))
    assert isinstance(run.schedule(), Schedule)


@pytest.mark.parametrize("kind", ["die", "stall"])
def test_a_dead_or_stalled_rank_is_named_and_everything_ends(
    weights: Checkpoint, kind: str
) -> None:
    """Rank 1 (new0) fails once it has the first chunk of layer 2."""
    before = set(multiprocessing.active_children())
    started = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        run_multicast(_plan(2), weights, fault=InjectedFault(1, 2, kind=kind), timeout_s=2.0)
    error = info.value
    assert (error.rank, error.layer, error.label) == (1, 2, "new0")  # rank 0 is the host copy
    if kind == "die":  # seen by its exit code, perhaps also by a peer that lost it
        assert re.match(r"rank 1 \(new0\) died \(exit code -9\) at layer 2($|; )", str(error))
    else:  # seen by a peer whose receive or send timed out
        said = r"rank [02] \([^)]+\) reported: timed out after 2 s (receiving|sending)"
        assert re.match(rf"rank 1 \(new0\) stalled at layer 2; {said}", str(error)), str(error)
    assert time.monotonic() - started < 60
    assert set(multiprocessing.active_children()) == before


def test_a_fault_that_could_never_fire_is_refused_before_the_run(
    pool: Workers, weights: Checkpoint
) -> None:
    """Units are 0..5 for 4 layers; rank 7 runs no job. The pool is left as it was."""
    with pytest.raises(InvalidInputError, match=r"fault layer 6 does not exist: .* 5 \(the head\)"):
        run_multicast(_plan(2), weights, workers=pool, fault=InjectedFault(1, 6))
    with pytest.raises(InvalidInputError, match="fault names rank 7, which runs no job"):
        run_multicast(_plan(2), weights, workers=pool, fault=InjectedFault(7, 1))
    _check_run(run_multicast(_plan(2), weights, workers=pool))


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        # a new instance (rank 1) stops once the head starts to arrive: it had every other
        # unit, its peers time out on it; a rank that reported its own timeout and then got the
        # end of the run must not pass for the culprit
        (
            InjectedFault(1, 5, kind="stall"),
            r"rank 1 \(new\d\) stalled at the head \(unit 5\); .*no sign of life from rank 1",
        ),
        # the old instance (rank 3) holds the whole model: it has layer 4 once it loaded it
        (
            InjectedFault(3, 4, kind="die"),
            r"rank 3 \(old instance\) died \(exit code -9\) at layer 4",
        ),
    ],
    ids=["new-instance-stalls-at-the-head", "old-instance-dies"],
)
def test_a_failing_rank_of_a_live_run_is_named_with_a_unit_that_exists(
    weights: Checkpoint, fault: InjectedFault, message: str
) -> None:
    before = set(multiprocessing.active_children())
    with pytest.raises(RankFailedError, match=message) as info:
        _live("zigzag", None, weights, fault=fault, timeout_s=2.0)
    assert (info.value.rank, info.value.layer) == (fault.rank, fault.layer)
    assert set(multiprocessing.active_children()) == before


def test_validate_quick_from_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "validate.png"
    before = set(multiprocessing.active_children())
    argv = ["validate", "--scenario", "quick", "--policies", "zigzag", "--json", "--png", str(png)]
    assert main(argv) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers_bit_exact"] is True
    assert report["max_abs_logit_diff"] <= LOGIT_TOLERANCE
    for key in ("median_latency_error", "p90_latency_error", "makespan_error"):
        assert report[key] >= 0
    assert set(report["policies"]) == {"zigzag"}  # the notebook runs all three
    assert all(p["violations"] == [] for p in report["policies"].values())
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(multiprocessing.active_children()) == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_validate_on_cuda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--scenario", "quick", "--device", "cuda", "--json", "--png", ""]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["layers_bit_exact"] is True and report["device"] == "cuda"
    assert report["max_abs_logit_diff"] <= LOGIT_TOLERANCE


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="NCCL needs a GPU per rank (4)")
def test_multicast_over_nccl(weights: Checkpoint) -> None:
    _check_run(run_multicast(_plan(3), weights, device="cuda"))
