"""The small Llama-style model the executor moves and runs, and its checkpoints."""
