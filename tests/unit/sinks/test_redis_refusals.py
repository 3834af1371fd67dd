"""Which Redis errors the sink waits out (counted by reason) and which it gives up on."""

from __future__ import annotations

import pytest
from redis._parsers.base import BaseParser
from redis.exceptions import ResponseError

from sinks.redis.sink import transient_reason

OOM = "OOM command not allowed when used memory > 'maxmemory'."
MISCONF = "MISCONF Redis is configured to save RDB snapshots, but it's currently unable to persist"
READONLY = "READONLY You can't write against a read only replica. script: 3f2a, on @user_script:31."


def answered(error: str, queued: bool = False) -> ResponseError:
    """The exception redis-py makes of an error Redis answered (`queued`: to a command of a
    transaction, which redis-py words with the command's place in the pipeline)."""
    exc = BaseParser.parse_error(error)
    assert isinstance(exc, ResponseError)
    if queued:
        exc.args = (f"Command # 1 (EVALSHA 3303e7 3...) of pipeline caused error: {exc}",)
    return exc


@pytest.mark.parametrize("queued", [False, True], ids=["in-exec", "queued"])
@pytest.mark.parametrize(
    ("error", "reason"),
    [(OOM, "oom"), (MISCONF, "misconf"), (READONLY, "readonly"), ("BUSY script", "busy")],
)
def test_a_refusal_that_goes_away_by_itself_is_transient_with_its_reason(
    error: str, reason: str, queued: bool
) -> None:
    assert transient_reason(answered(error, queued)) == reason


@pytest.mark.parametrize(
    "error",
    [
        "WRONGTYPE Operation against a key holding the wrong kind of value",
        "ERR Error running script (call to f_3f2a): @user_script:1: bad",
        "EXECABORT Transaction discarded because of previous errors.",
    ],
)
def test_a_refusal_for_good_is_not_transient(error: str) -> None:
    assert transient_reason(answered(error)) is None
    assert transient_reason(answered(error, queued=True)) is None
    assert transient_reason(ValueError(OOM)) is None
