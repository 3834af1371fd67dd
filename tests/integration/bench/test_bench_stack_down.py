"""`gpuwatch bench` against a stack that is not up: it says so at once, naming what does
not answer."""

from __future__ import annotations

import pytest
from support import free_port

from gpuwatch import cli


def test_a_stack_that_is_not_up_is_said_at_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("GPUWATCH_KAFKA_BOOTSTRAP", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("GPUWATCH_REDIS_URL", f"redis://:pw@127.0.0.1:{free_port()}/0")
    assert cli.main(["bench", "--quick", "--json"]) == 1
    err = capsys.readouterr().err
    assert "bench worker: Kafka at 127.0.0.1:" in err
    assert "is not answering; Redis at redis://:***@127.0.0.1:" in err
    assert "gpuwatch stack up" in err
    assert cli.main(["bench", "producer", "--quick"]) == 1
    assert "Redis" not in capsys.readouterr().err  # the producer needs only Kafka
