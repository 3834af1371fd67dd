"""The node side's rules: idleness, usage per pod, GPU windows, GPU and node alerts, node doc."""
