"""The Redis sink: key names, the pure write plan, the Lua scripts, the writer of `sink redis`."""
