"""The small Llama-style model the executor moves and runs, with seeded weights."""
