"""Cluster state files: the YAML/JSON a serving stack (or the CLI) describes its cluster in.

::

    topology: paper-a800-32            # a catalog name, a topology file, or an inline mapping
    models: [mistral-small-24b]        # one host copy each, placed at start
    instances:
      - {model: mistral-small-24b, gpus: [h0/gpu0, h0/gpu1], role: prefill,
         queue: [[0.0, 2048], [0.1, 512]], kv_bytes_used: 0, id: p0}
      - {model: mistral-small-24b, gpus: [h1/gpu0, h1/gpu1], role: loading, id: n0,
         loading: {role: decode, units_ready_s: [0.0, 0.1, ..., 0.5],    # per unit, from now
                   needs: [p0], edges: [[h0/gpu0, h0/nvswitch]]}}  # what the arrivals need
    background_flows:
      - {src: h0/gpu0, dst: h1/gpu0, gbps: 20}            # routed src -> dst
      - {edges: [[h0/nic0, leaf0], [leaf0, h1/nic0]], bytes_per_s: 2.5e9, name: kv}
      - {edges: [[h0/gpu2, h0/nic0]], bytes_per_s: 1.2e10, until_s: 0.42}   # ends (a plan's step)

A model is a preset name, a path to a config.json, or a mapping with ``config`` (and optional
``name``, ``revision``, ``weights_hash``). Every error names the entry it is about.

:func:`save_state` writes what :func:`~blitzplan.apply_plan` and :func:`~blitzplan.recover`
produce, and :func:`load_state` reads it back equal: the same keys plus ``removed`` (failed
``nodes`` and ``links`` taken out of the topology, as ``Topology.without`` does),
``host_copies`` (each model's host copy where it is, ``{name, revision, content_hash,
hash_kind, host, bytes}``, instead of ``models`` placing them), routed background flows with
their ``edges`` and exact ``bytes_per_s``, queued requests with their ids, and ``counters`` (the
ids the state handed out, so that none is handed out again).
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from blitzplan.cluster import ClusterState
from blitzplan.errors import InvalidInputError
from blitzplan.scale.stateread import state_from_dict
from blitzplan.scale.statewrite import state_to_dict

__all__ = ["load_state", "save_state", "state_from_dict", "state_to_dict"]


def load_state(path: str | Path) -> ClusterState:
    """A ClusterState from a YAML or JSON state file."""
    file = Path(path)
    if not file.is_file():
        raise InvalidInputError(f"state file {str(path)!r} does not exist")
    try:
        text = file.read_text()
        data = json.loads(text) if file.suffix == ".json" else yaml.safe_load(text)
    except (yaml.YAMLError, json.JSONDecodeError) as exc:
        raise InvalidInputError(f"state file {str(path)!r} does not parse: {exc}") from exc
    return state_from_dict(data, source=str(path), base=file.parent)


def save_state(state: ClusterState, path: str | Path, *, topology: object = None) -> None:
    """Write ``state`` as a state file (JSON for a ``.json`` path, else YAML) that
    :func:`load_state` reads back equal. ``topology`` is the file's ``topology`` entry (a
    catalog name, a path or a mapping; default: the topology's catalog name)."""
    data = state_to_dict(state, topology=topology)
    file = Path(path)
    if file.suffix == ".json":
        file.write_text(json.dumps(data, indent=1) + "\n")
    else:
        file.write_text(yaml.safe_dump(data, sort_keys=False))
