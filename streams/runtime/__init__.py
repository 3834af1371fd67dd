"""The agent loop (batches, positions, state writes) and the rewinds of input gaps, no Faust."""
