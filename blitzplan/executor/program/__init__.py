"""The program runner: a ScalePlan document's transfer program, run from its JSON."""
