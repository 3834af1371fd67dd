"""The `deadletter` topic: messages nobody could process, whole when they fit, keyed by source."""

import base64
import binascii
from typing import Annotated, Final, Literal

import msgspec

from .codec import DAY_MS, TopicSpec
from .fields import EpochMs, Value

__all__ = ["TOPIC", "DeadLetter", "RawEncoding"]

RawEncoding = Literal["utf-8", "base64"]

NOT_FROM_KAFKA = -1  # partition/offset of a message that never reached Kafka (a producer's)
KEY_CHARS = 1024  # of a too large letter's key: a key is a node name or a pod uid
ERROR_CHARS = 4096  # of a too large letter's error: the first reasons say what is wrong

_JSON = msgspec.json.Encoder()


def _cut(text: str, chars: int) -> str:
    """The text, or its start and how much was left out."""
    if len(text) <= chars:
        return text
    return f"{text[:chars]}... ({len(text) - chars} more characters)"


def _raw_size(letter: "DeadLetter") -> int:
    """Bytes of the original value a letter holds."""
    if letter.raw_encoding == "utf-8":
        return len(letter.raw.encode("utf-8"))
    return len(letter.raw) // 4 * 3 - letter.raw.count("=")


class DeadLetter(Value, frozen=True, kw_only=True):
    """A message a worker or producer gave up on, with the reason and the original bytes.

    `raw` holds the original value as text when it is valid UTF-8, else as base64
    (`raw_encoding` says which), so binary garbage survives for a re-drive; `raw_bytes()`
    gives the bytes back. Use `from_bytes` to build one. A letter must fit in one Kafka
    message: `fitted(limit)` cuts a too large one's `key` and `error`, then its `raw`, and
    its `error` then ends with `(raw cut to the first N of M bytes)`.
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

    def fitted(self, limit: int) -> "DeadLetter":
        """This letter if it encodes to at most `limit` bytes, else one cut to fit.

        The key is cut to `KEY_CHARS` characters and the error to `ERROR_CHARS`, then `raw`
        to what room is left: whole base64 quads, or whole characters of UTF-8 text (JSON
        escapes make some characters take six bytes). `raw_bytes()` then gives the start of
        the original value. A limit too small for a letter without raw is a ValueError.
        """
        size = len(TOPIC.encode(self))
        if size <= limit:
            return self
        key = None if self.key is None else self.key[:KEY_CHARS]
        total = _raw_size(self)
        # The note's number is written at its widest, so that the room computed holds.
        note = f" (raw cut to the first {total} of {total} bytes)"
        head = msgspec.structs.replace(self, key=key, error=_cut(self.error, ERROR_CHARS), raw="")
        room = limit - len(TOPIC.encode(head)) - len(_JSON.encode(note))
        if room < 0:
            raise ValueError(f"a dead letter needs more than {limit} bytes without its raw")
        if self.raw_encoding == "base64":
            raw = self.raw[: room // 4 * 4]
        else:
            raw = self.raw[:room]
            while (escaped := len(_JSON.encode(raw)) - 2) > room:
                raw = raw[: max(0, len(raw) * room // escaped - 1)]
        cut = msgspec.structs.replace(head, raw=raw)
        kept = len(cut.raw_bytes())
        if kept == total:  # the key and the error made it too large
            return cut
        note = f" (raw cut to the first {kept} of {total} bytes)"
        return msgspec.structs.replace(cut, error=cut.error + note)

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
