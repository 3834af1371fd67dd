"""Units of work the node's pods report: their opted-in Prometheus counters, scraped.

A pod opts in with annotations (`targets.py`); the agent reads its exposition
(`fetch.py`, `exposition.py`), turns counters into increases that survive resets
(`deltas.py`) and produces `work.units` records (`scraper.py`).
"""
