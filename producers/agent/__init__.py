"""The node agent: its loop, one sample assembled per tick, its metrics."""
