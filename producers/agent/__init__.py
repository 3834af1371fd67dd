"""The node agent: its loop, one sample assembled per tick, the outbox and publisher, metrics."""
