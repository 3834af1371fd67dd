"""Typed JSON (de)serialisation of topic values, with one error tree for every bad message."""

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Literal, TypeVar

import msgspec
import msgspec.inspect

__all__ = [
    "DAY_MS",
    "Codec",
    "KeyKind",
    "MalformedJSON",
    "SchemaError",
    "TopicSpec",
    "UnknownSchemaVersion",
    "WrongSchema",
]

T = TypeVar("T", bound=msgspec.Struct)

DAY_MS = 86_400_000  # topic retentions are whole days

KeyKind = Literal[
    "node",
    "pod_uid",
    "gpu_uuid",
    "alert_fingerprint",
    "source_topic",
    "cluster/product/resource",
    "workload_uid",
]
"""What a topic's message key holds (always as a UTF-8 string)."""


class SchemaError(ValueError):
    """A message does not match the schema it was decoded as; permanent, never retried.

    `schema` is the expected schema name, `field` a JSONPath-like location of the offending
    field (`$` for the whole message), `reason` says what is wrong in words.
    """

    def __init__(self, schema: str, field: str, reason: str) -> None:
        super().__init__(schema, field, reason)
        self.schema = schema
        self.field = field
        self.reason = reason

    def __str__(self) -> str:
        return f"{self.schema}: {self.field}: {self.reason}"


class MalformedJSON(SchemaError):  # noqa: N818 - names are the contract
    """The bytes are not JSON, or the JSON is not an object."""


class UnknownSchemaVersion(SchemaError):  # noqa: N818 - names are the contract
    """The message names the expected schema with a major version this code does not know."""


class WrongSchema(SchemaError):  # noqa: N818 - names are the contract
    """The message's `schema` field names another value type, or is missing."""


# msgspec appends the location as " - at `$.path`"; a missing field is named in the reason.
_AT = re.compile(r"(?s)(?P<reason>.*) - at `(?P<path>\$[^`]*)`")
_MISSING = re.compile(r"Object missing required field `(?P<name>[^`]+)`")
_SHOWN_CHARS = 80  # enough to recognise a value, short enough for a log line


class _SchemaProbe(msgspec.Struct):
    """Only the `schema` field of any JSON object; decoded on the error path only."""

    schema: Any = msgspec.UNSET


_PROBE = msgspec.json.Decoder(_SchemaProbe)
_ENCODER = msgspec.json.Encoder()


def _schema_literal(value_type: type[msgspec.Struct]) -> str:
    """The single `Literal` value of a value type's required `schema` field."""
    info = msgspec.inspect.type_info(value_type)
    fields = info.fields if isinstance(info, msgspec.inspect.StructType) else ()
    for f in fields:
        if f.name == "schema":
            literal = f.type
            if (
                isinstance(literal, msgspec.inspect.LiteralType)
                and len(literal.values) == 1
                and isinstance(literal.values[0], str)
                and f.required
            ):
                return literal.values[0]
    raise TypeError(f"{value_type.__name__} needs a required `schema: Literal[...]` field")


def _shown(value: object) -> str:
    """A bounded repr of a foreign value for an error message."""
    text = repr(value)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."


class Codec(Generic[T]):
    """Decodes and encodes one value type; create once per type and reuse (hot path)."""

    def __init__(self, value_type: type[T]) -> None:
        self.value_type = value_type
        self.schema_name = _schema_literal(value_type)
        self.family, _, major = self.schema_name.rpartition("/")
        self.supported_majors = (major,)
        self._decoder = msgspec.json.Decoder(value_type)

    def decode(self, raw: bytes | str) -> T:
        """Decode and validate one message; raises a `SchemaError` subclass when it is bad.

        JSON is UTF-8: bytes that are not are refused whole. msgspec checks the strings it
        decodes, not the names of fields it skips, so a broken byte in an unknown or optional
        field's name would otherwise pass. An ASCII message (nearly all) needs no further
        look; `isascii` runs at memory speed.
        """
        if isinstance(raw, bytes) and not raw.isascii():
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise MalformedJSON(
                    self.schema_name, "$", f"not JSON: not UTF-8 at byte {exc.start}"
                ) from exc
        try:
            return self._decoder.decode(raw)
        except msgspec.ValidationError as exc:
            raise self._invalid(raw, str(exc)) from exc
        except msgspec.DecodeError as exc:
            raise MalformedJSON(self.schema_name, "$", f"not JSON: {exc}") from exc
        except RecursionError as exc:  # msgspec recurses per level, even into unknown fields
            raise MalformedJSON(self.schema_name, "$", f"nested too deeply to read: {exc}") from exc

    def encode(self, value: T) -> bytes:
        """Encode a value as compact UTF-8 JSON (constraints are checked on decode, not here)."""
        return _ENCODER.encode(value)

    def _invalid(self, raw: bytes | str, message: str) -> SchemaError:
        """Map a msgspec validation message to the most telling `SchemaError`."""
        at = _AT.fullmatch(message)
        reason, path = (at["reason"], at["path"]) if at else (message, "$")
        missing = _MISSING.fullmatch(reason)
        if missing:
            path = f"{path}.{missing['name']}"
        if path == "$" and reason.startswith("Expected `object`"):
            return MalformedJSON(self.schema_name, "$", f"not a JSON object: {reason}")
        # Whatever field failed, a message of another type or version says so first.
        return self._schema_mismatch(raw) or SchemaError(self.schema_name, path, reason)

    def _schema_mismatch(self, raw: bytes | str) -> SchemaError | None:
        """`WrongSchema`/`UnknownSchemaVersion` when the `schema` field is not ours, else None."""
        try:
            found = _PROBE.decode(raw).schema
        except msgspec.DecodeError:  # pragma: no cover - raw already parsed as an object
            return None
        except RecursionError:  # nested too deeply after the failed field: report that field
            return None
        name, where = self.schema_name, "$.schema"
        if found is msgspec.UNSET:
            return WrongSchema(name, where, "the `schema` field is missing")
        if not isinstance(found, str):
            return WrongSchema(name, where, f"`schema` must be a string, got {_shown(found)}")
        if found == name:
            return None
        if found.rpartition("/")[0] == self.family:
            majors = ", ".join(self.supported_majors)
            return UnknownSchemaVersion(
                name,
                where,
                f"unknown major version {_shown(found)} of {self.family} (supported: {majors})",
            )
        return WrongSchema(name, where, f"expected {name!r}, got {_shown(found)}")


@dataclass(frozen=True, kw_only=True)
class TopicSpec(Generic[T]):
    """One topic: its name, key, value type and codec, and its Kafka configuration.

    `name` has no prefix (`nvml.samples`); `full_name(prefix)` adds the configured one.
    `retention_ms` None means keep forever; `internal` topics are not a public interface.
    """

    name: str
    key: KeyKind
    value_type: type[T]
    key_of: Callable[[T], str] = field(compare=False, repr=False)
    """The message key of a value (what `key` names)."""
    compacted: bool
    retention_ms: int | None
    internal: bool
    codec: Codec[T] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "codec", Codec(self.value_type))

    @property
    def schema_name(self) -> str:
        """The value schema, e.g. `gpuwatch.nvml.sample/v1`."""
        return self.codec.schema_name

    @property
    def json_schema_file(self) -> str:
        """File name of the JSON Schema: the schema name with `/` as `.`, plus `.json`."""
        return self.schema_name.replace("/", ".") + ".json"

    def full_name(self, prefix: str) -> str:
        """The Kafka topic name under a prefix such as `gpuwatch.`."""
        return f"{prefix}{self.name}"

    def decode(self, raw: bytes | str) -> T:
        """Decode one message value; see `Codec.decode`."""
        return self.codec.decode(raw)

    def encode(self, value: T) -> bytes:
        """Encode one message value; see `Codec.encode`."""
        return self.codec.encode(value)
