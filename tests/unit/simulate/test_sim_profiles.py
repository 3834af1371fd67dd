"""The SimReader profiles the simulator adds: dev bursts and a crash loop's fixed up time."""

from __future__ import annotations

import itertools

from gpuwatch.harness.simulate.gpus import DEV_BUSY_SHARE, SimGpu, SimReader, SimWorkload

GIB = 1 << 30
T0 = 1_764_374_400.0
GPU = SimGpu.preset("l40s", "GPU-0", 0)


class Clock:
    def __init__(self) -> None:
        self.t = T0

    def __call__(self) -> float:
        return self.t


def utils(reader: SimReader, clock: Clock, seconds: int) -> list[float]:
    out = []
    for _ in range(seconds):
        util = reader.read().devices[0].util_pct
        assert util is not None
        out.append(util)
        clock.t += 1.0
    return out


def test_a_dev_pod_bursts_for_about_a_third_of_its_cycle() -> None:
    clock = Clock()
    reader = SimReader([GPU], [SimWorkload(1, GPU.uuid, "dev", 4 * GIB)], seed=3, now=clock)

    seen = utils(reader, clock, 3000)

    busy = [u for u in seen if u > 0]
    assert all(10.0 <= u <= 60.0 for u in busy)  # half to all of a 20-60 % peak
    assert abs(len(busy) / len(seen) - DEV_BUSY_SHARE) < 0.05
    idle_runs = [len(list(run)) for idle, run in itertools.groupby(seen, lambda u: u == 0) if idle]
    assert 84 <= max(idle_runs) <= 210  # 70 % of a 120-300 s cycle


def test_a_crash_loop_with_up_s_runs_exactly_that_long() -> None:
    clock = Clock()
    work = SimWorkload(1, GPU.uuid, "crashloop", 4 * GIB, start_s=T0, up_s=12.0)
    reader = SimReader([GPU], [work], seed=3, now=clock)

    present = []
    for _ in range(60):
        present.append(bool(reader.read().devices[0].processes))
        clock.t += 1.0

    assert present[:12] == [True] * 12
    assert present[12:22] == [False] * 10  # the first back-off: 10 s
    assert present[22:34] == [True] * 12
    assert present[34:54] == [False] * 20
