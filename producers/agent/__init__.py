"""The node agent: its loop, one sample assembled per tick, its table of DRA devices, metrics."""
