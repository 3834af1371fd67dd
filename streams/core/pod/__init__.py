"""The pod side's rules: pod state, lifecycle, attribution windows, pod alerts, one step."""
