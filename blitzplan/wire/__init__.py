"""The wire format: what planner and data plane share, with no planner inside.

- :mod:`.canonical`: RFC 8785 canonical JSON, the digests ``plan_id`` and ``program_id``;
- :mod:`.scaleprogram`: the program export's records (steps, new instances, live pairs),
  its reader (``ScaleProgram.from_json``) and its JSON Schema;
- :mod:`.plan_program`: a full ScalePlan document's program export, from its JSON alone;
- :mod:`.program_rules`, :mod:`.program_screen`, :mod:`.program_bytes` and :mod:`.pair_rules`:
  the rules every transfer program and its live pairs obey, checked from the document alone
  (what the full document's reader, the export's reader and the executor refuse), over the
  program's columns first;
- :mod:`.schema_fields`: what every property of the documents means and may hold.

``blitzplan.scale`` writes documents with it; ``blitzplan.executor`` reads them with it alone.
"""
