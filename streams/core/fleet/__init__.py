"""The fleet side's rules: capacity of a snapshot, and the fleet partition's inputs and state."""
