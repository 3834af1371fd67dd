"""`gpuwatch replay` output from hand-made records: the table, the JSON events, the PNG."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from replay_records import NODE, SPAN, T0, TRAIN, S, incident, sample
from test_replay_story import revised_windows

from gpuwatch.harness.examples import GPU_0, GPU_1
from gpuwatch.replay.match import assemble, resolve, state_bands
from gpuwatch.replay.read import Progress
from gpuwatch.replay.story import SampleDigest, Story, Subject
from gpuwatch.replay.view import plot, render_text, to_json

PNG = b"\x89PNG\r\n\x1a\n"


def story(subject: Subject, *, samples: bool = True) -> Story:
    found = incident()
    scope = resolve(subject, found)
    digest = SampleDigest(subject, SPAN, scope, keep_series=True)
    if samples:
        for i, util in enumerate([10.0, 50.0, None, 90.0]):
            digest.add(sample(i + 1 + (i == 3), T0 + i * S, util0=util, mem0_gib=i + 1))
    summaries = digest.summaries()
    events = assemble(subject, SPAN, found, scope, summaries)
    bands = state_bands(events, SPAN) if subject.kind == "pod" else []
    return Story(subject, SPAN, scope, events, summaries, digest.series, bands, ["a note"])


def test_the_pod_table_tells_the_transitions_windows_and_alerts_with_their_numbers() -> None:
    text = render_text(story(Subject("pod", "ml/train-0")))
    lines = text.splitlines()
    assert lines[0] == (
        "gpuwatch replay  pod ml/train-0  2025-11-29 10:40:00 -> 2025-11-29 11:00:00 UTC (20m00s)"
    )
    assert f"  uid {TRAIN}" in lines
    body = [line for line in lines if line.startswith("2025-11-29 ")]
    assert [line.split()[2] for line in body] == [
        "lifecycle",
        "window",
        "window",
        "alert",
        "lifecycle",
        "alert",
        "lifecycle",
        "alert",
    ]
    assert "10:45:00  lifecycle  running -> stalled (Idle)  queued 30s  running 4m30s" in text
    # 57.0 GiB is the example's 61203283968 bytes; the waste of 3 idle s at $0.0658/min.
    assert (
        "10:41:00-10:42:00  running  used 51.6 of 60.0 GPU-s  idle 3.0  VRAM peak 57.0 GiB  "
        "cost $0.0658  waste $0.0033"
    ) in text
    assert "RESOLVED PodStalled (warning)" in body[-1]
    # Two windows in range: 30.0 + 51.6 used, 20 + 3 idle, 2 x 0.0658 cost, 0.0219 + 0.0033.
    assert (
        "attribution: 2 pod windows, allocated 120.0 GPU-s, used 81.6, idle 23.0, "
        "cost $0.1316, waste $0.0252"
    ) in lines
    (row,) = [line for line in lines if line.startswith(GPU_0)]
    # 4 samples, 3 with a reading: mean (10 + 50 + 90) / 3; peak 4 GiB (the last); seq 4 lost.
    assert row.split()[1:] == [
        NODE,
        "NVIDIA",
        "H100",
        "80GB",
        "HBM3",
        "4",
        "(1",
        "no",
        "util)",
        "50.0%",
        "90.0%",
        "4.0",
        "GiB",
        "/",
        "79.6",
        "GiB",
        "1",
    ]
    assert lines[-1] == "note: a note"


def test_a_revised_window_says_its_revision_and_counts_once_in_the_totals() -> None:
    subject = Subject("node", NODE)
    found = revised_windows()
    scope = resolve(subject, found)
    events = assemble(subject, SPAN, found, scope)
    text = render_text(Story(subject, SPAN, scope, events, [], {}, [], []))
    assert "10:42:00-10:43:00  running  used 40.0 of 60.0 GPU-s  idle 5.0" in text
    assert "waste $0.0055  (revision 1)" in text
    assert "util 90%" in text
    assert text.count("(revision 1)") == 2
    assert "attribution: 1 pod windows, allocated 60.0 GPU-s, used 40.0, idle 5.0" in text


def test_a_gpu_table_shows_the_pods_part_of_that_gpu_and_the_gpu_windows() -> None:
    text = render_text(story(Subject("gpu", GPU_1), samples=False))
    assert "  pods ml/other-0" in text
    assert "ml/other-0 (0d4e9b71)  10:41:00-10:42:00  running  used 24.0 of 60.0 GPU-s" in text
    assert "(this GPU's part; the pod's waste $0.0000)" in text
    assert "gpu windows: 1, busy 24 s, idle 36 s (allocated 36 s, unallocated 0 s)" in text
    assert "samples: none in the range" in text


def test_json_is_a_list_of_typed_events_in_order_with_the_records() -> None:
    events = json.loads(to_json(story(Subject("pod", "ml/train-0"))))
    assert [(e["kind"], (e["ts"] - T0) // S) for e in events] == [
        ("samples", 0),
        ("lifecycle", 30),
        ("attribution", 60),
        ("attribution", 120),
        ("alert", 240),
        ("lifecycle", 300),
        ("alert", 300),
        ("lifecycle", 900),
        ("alert", 900),
    ]
    assert events[1]["time"] == "2025-11-29T10:40:30Z"
    stalled = events[5]["record"]
    assert (stalled["schema"], stalled["uid"], stalled["to_state"], stalled["reason"]) == (
        "gpuwatch.pod.lifecycle/v1",
        TRAIN,
        "stalled",
        "Idle",
    )
    samples = events[0]["record"]
    assert (samples["count"], samples["util_known"], samples["seq_gaps"]) == (4, 3, 1)
    assert samples["util_mean_pct"] == pytest.approx(50.0)


def test_the_plot_is_a_png_of_every_sample_point(tmp_path: Path) -> None:
    path = tmp_path / "train-0.png"
    the_story = story(Subject("pod", "ml/train-0"))
    assert plot(the_story, path) == 4
    data = path.read_bytes()
    assert data[:8] == PNG
    assert len(data) > 10_000  # two axes, four state bands, lines and labels
    assert len(the_story.bands) == 4


def test_a_story_without_samples_still_plots(tmp_path: Path) -> None:
    path = tmp_path / "node.png"
    assert plot(story(Subject("node", NODE), samples=False), path) == 0
    assert path.read_bytes()[:8] == PNG


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_progress_stays_quiet_for_a_short_read_and_counts_a_long_one() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=False, clock=clock)
    progress.begin("nvml.samples", 200)
    progress.advance(50)
    clock.now = 0.5
    progress.finish()
    assert out.getvalue() == ""  # under a second: nothing
    progress.begin("nvml.samples", 200)
    clock.now = 2.0
    progress.advance(50)
    clock.now = 3.0
    progress.advance(50)  # within 5 s of the last line: not repeated in a log
    clock.now = 8.0
    progress.advance(50)
    progress.finish()
    assert out.getvalue().splitlines() == [
        "replay: nvml.samples 50/200 records (25%)",
        "replay: nvml.samples 150/200 records (75%)",
        "replay: nvml.samples 150/200 records (75%) done",
    ]


def test_progress_on_a_terminal_redraws_one_bar_and_erases_it() -> None:
    out, clock = io.StringIO(), Clock()
    progress = Progress(out, tty=True, clock=clock)
    progress.begin("alerts", 10)
    clock.now = 1.5
    progress.advance(4)
    clock.now = 1.55
    progress.advance(3)  # within 0.1 s of the last draw: not drawn
    clock.now = 1.7
    progress.advance(3)
    progress.finish()
    text = out.getvalue()
    frames = [re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", f) for f in text.split("\r\x1b[2K")[1:]]
    assert [f.split()[:2] + f.split()[-3:] for f in frames] == [
        ["replay:", "alerts", "4/10", "records", "40%"],
        ["replay:", "alerts", "10/10", "records", "100%"],
        ["replay:", "alerts", "10/10", "records", "100%"],  # the last, drawn as it stops
    ]
    assert text.endswith("\x1b[1A\x1b[2K")  # erased: what comes next is written over it


def test_json_is_byte_for_byte_what_scripts_read() -> None:
    expected = (Path(__file__).parent / "expected_replay_pod.json").read_text(encoding="utf-8")
    assert to_json(story(Subject("pod", "ml/train-0"))) == expected
