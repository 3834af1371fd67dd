"""The `deadletter` topic: messages nobody could process, kept losslessly, keyed by source topic."""

import base64
import binascii
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import EpochMs, Value

__all__ = ["TOPIC", "DeadLetter", "RawEncoding"]

RawEncoding = Literal["utf-8", "base64"]

NOT_FROM_KAFKA = -1  # partition/offset of a message that never reached Kafka (a producer's)


class DeadLetter(Value, frozen=True, kw_only=True):
    """A message a worker or producer gave up on, with the reason and the original bytes.

    `raw` holds the original value as text when it is valid UTF-8, else as base64
    (`raw_encoding` says which), so binary garbage survives for a re-drive; `raw_bytes()`
    gives the bytes back. Use `from_bytes` to build one.
    """

    schema: Literal["gpuwatch.deadletter/v1"]
    source_topic: Annotated[str, msgspec.Meta(description="full topic name, with its prefix")]
    partition: Annotated[
        int, msgspec.Meta(ge=-1, description="source partition; -1 when not from Kafka")
    ]
    offset: Annotated[int, msgspec.Meta(ge=-1, description="source offset; -1 when not from Kafka")]
    ts: Annotated[EpochMs, msgspec.Meta(description="when processing gave up, epoch ms")]
    key: Annotated[
        str | None,
        msgspec.Meta(description="original key as UTF-8 (bad bytes replaced); null if none"),
    ]
    error: Annotated[str, msgspec.Meta(description="why, e.g. the SchemaError text")]
    raw: str
    raw_encoding: RawEncoding

    @classmethod
    def from_bytes(
        cls,
        *,
        source_topic: str,
        ts: int,
        error: str,
        raw: bytes,
        key: bytes | str | None = None,
        partition: int = NOT_FROM_KAFKA,
        offset: int = NOT_FROM_KAFKA,
    ) -> "DeadLetter":
        """Wrap an undecodable message: UTF-8 text when the bytes decode, else base64."""
        encoding: RawEncoding
        try:
            text, encoding = raw.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            text, encoding = base64.b64encode(raw).decode("ascii"), "base64"
        if isinstance(key, bytes):
            key = key.decode("utf-8", errors="replace")
        return cls(
            schema="gpuwatch.deadletter/v1",
            source_topic=source_topic,
            partition=partition,
            offset=offset,
            ts=ts,
            key=key,
            error=error,
            raw=text,
            raw_encoding=encoding,
        )

    def raw_bytes(self) -> bytes:
        """The original message bytes; raises ValueError when base64 `raw` is corrupt."""
        if self.raw_encoding == "utf-8":
            return self.raw.encode("utf-8")
        try:
            return base64.b64decode(self.raw, validate=True)
        except binascii.Error as exc:
            raise ValueError(f"deadletter raw is not valid base64: {exc}") from exc


TOPIC: Final = TopicSpec(
    name="deadletter",
    key="source_topic",
    value_type=DeadLetter,
    key_of=lambda value: value.source_topic,
    # Delete after 14 days: two weeks for a human to notice, fix the cause and re-drive;
    # a dead letter nobody looked at in that time is noise.
    compacted=False,
    retention_ms=14 * DAY_MS,
    internal=False,
)
