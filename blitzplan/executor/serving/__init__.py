"""Live serving: a document's live pair run for real, driven by the relay state machine."""
