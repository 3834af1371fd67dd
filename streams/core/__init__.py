"""The pure core of the stream processors: split, windows, lifecycle, alerts, ticks, capacity."""
