"""The workload side's rules: where a Kueue workload stands, and its lifecycle step by step."""
