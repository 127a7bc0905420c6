"""Worker processes, their failures and the pool that runs them."""
