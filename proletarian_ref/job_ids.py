"""Job-id strategies: how an id is made and how it is stored (proletarian.job-id-strategies)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Protocol, runtime_checkable

from proletarian_ref.errors import ConfigurationError

# uuid.UUID keeps its value in two slots, which its own unpickling sets without __init__; a claim's id is
# made that way, for a quarter of the instructions of __init__'s argument checks, where the slots are so.
_UUID_SLOTS: Final = {"int", "is_safe"} <= set(getattr(uuid.UUID, "__slots__", ()))
_new_object: Final = object.__new__
_set_slot: Final = object.__setattr__
_SAFETY_UNKNOWN: Final = uuid.SafeUUID.unknown


@runtime_checkable
class JobIdStrategy(Protocol):
    """Generates a job id and converts it to and from the value the database column holds."""

    def generate_id(self) -> Any:
        """A new id, or None when the database generates it."""
        ...

    def encode_id(self, job_id: Any) -> Any:
        """The id as a driver parameter."""
        ...

    def decode_id(self, value: Any) -> Any:
        """The id from the value the driver returns."""
        ...


class PostgresqlUuidStrategy:
    """Random (v4) UUIDs in a PostgreSQL `uuid` column, which the driver converts natively."""

    def generate_id(self) -> uuid.UUID:
        return uuid.uuid4()

    def encode_id(self, job_id: Any) -> Any:
        return job_id

    def decode_id(self, value: Any) -> Any:
        if isinstance(value, str):
            return uuid.UUID(value)
        return value


class MysqlUuidStrategy:
    """Random (v4) UUIDs in a MySQL BINARY(16) column, in RFC 4122 byte order (uuid.UUID.bytes).

    That is Proletarian's layout (most significant long first), so HEX(job_id) is the UUID without dashes.
    """

    def generate_id(self) -> uuid.UUID:
        return uuid.uuid4()

    def encode_id(self, job_id: Any) -> bytes | None:
        if job_id is None:
            return None
        if isinstance(job_id, uuid.UUID):
            return job_id.bytes
        return uuid.UUID(str(job_id)).bytes

    def decode_id(self, value: Any) -> uuid.UUID | None:
        if value is None:
            return None
        # PyMySQL gives bytes already: no copy of them on every claim.
        if type(value) is not bytes:
            value = bytes(value)
        if len(value) != 16 or not _UUID_SLOTS:
            return uuid.UUID(bytes=value)  # and its error for a length that is not 16
        made = _new_object(uuid.UUID)
        _set_slot(made, "int", int.from_bytes(value))
        _set_slot(made, "is_safe", _SAFETY_UNKNOWN)
        return made


class MysqlTimeOrderedUuidStrategy(MysqlUuidStrategy):
    """Version 7 UUIDs (RFC 9562: Unix milliseconds first) in the same BINARY(16) layout; opt-in.

    MySQL's TIMESTAMP keeps whole seconds, and the claim's ORDER BY process_at leaves jobs of one second
    in the order of the index on (queue, process_at), which ends with the primary key: job_id's bytes.
    Random (v4) ids make that order random; these make it the order the ids were made in, so jobs of one
    second are claimed first-in first-out (within one process; across processes, by millisecond).
    """

    def generate_id(self) -> uuid.UUID:
        from uuid6 import uuid7  # Monotonic within a process: a millisecond seen twice is moved on by one.

        return uuid.UUID(bytes=uuid7().bytes)


class DbGeneratedStrategy:
    """The database makes the id (a column default or AUTO_INCREMENT); enqueue returns it.

    Proletarian binds an explicit NULL and returns nil; we omit the column so a PostgreSQL DEFAULT applies
    too, and read the generated key back.
    """

    def generate_id(self) -> None:
        return None

    def encode_id(self, job_id: Any) -> Any:
        return job_id

    def decode_id(self, value: Any) -> Any:
        return value


@dataclass(frozen=True, slots=True)
class ConstantIdStrategy:
    """Always the same id, for tests (like Proletarian's ->constant-id-strategy)."""

    value: Any

    def generate_id(self) -> Any:
        return self.value

    def encode_id(self, job_id: Any) -> Any:
        return self.value

    def decode_id(self, value: Any) -> Any:
        return self.value


def postgresql_uuid_strategy() -> PostgresqlUuidStrategy:
    return PostgresqlUuidStrategy()


def mysql_uuid_strategy() -> MysqlUuidStrategy:
    return MysqlUuidStrategy()


def mysql_time_ordered_uuid_strategy() -> MysqlTimeOrderedUuidStrategy:
    """Time-ordered (v7) UUIDs for MySQL, so jobs due in the same second are claimed in enqueue order.

    Needs the uuid6 package (the mysql extra). Workers need no change: they read any UUID back.
    """
    try:
        import uuid6  # noqa: F401  # checked here, so a missing package fails at setup, not at enqueue
    except ImportError as exc:
        raise ConfigurationError(
            "mysql_time_ordered_uuid_strategy needs the uuid6 package: pip install 'proletarian-ref[mysql]'"
        ) from exc
    return MysqlTimeOrderedUuidStrategy()


def db_generated_strategy() -> DbGeneratedStrategy:
    return DbGeneratedStrategy()


def constant_id_strategy(value: Any) -> ConstantIdStrategy:
    return ConstantIdStrategy(value)


def default_job_id_strategy(dialect: str) -> JobIdStrategy:
    """The dialect's own UUID layout, so MySQL users need not pass a strategy as Proletarian makes them."""
    if dialect == "mysql":
        return MysqlUuidStrategy()
    return PostgresqlUuidStrategy()


# uuid4() sets these bits of 16 random bytes: the version (4) in byte 6, the RFC 4122 variant in byte 8.
_VERSION_4: Final = bytes((byte & 0x0F) | 0x40 for byte in range(256))
_VARIANT_RFC_4122: Final = bytes((byte & 0x3F) | 0x80 for byte in range(256))
_RANDOM_BLOCK: Final = 256  # ids made per os.urandom call


def random_uuids(strategy: JobIdStrategy) -> Iterator[tuple[uuid.UUID, Any]] | None:
    """For the default UUID strategies exactly, endless (id, encoded id) pairs as generate_id makes them.

    enqueue's ids: random v4 UUIDs, the very values uuid.uuid4() makes (16 bytes of os.urandom with the
    version and variant bits set; `is_safe` unknown), from one os.urandom call per block and without
    UUID's checking constructor, which cost three quarters of a job's id. The calling thread's own
    supply, never another thread's. None for any other strategy (a subclass too), whose generate_id and
    encode_id are called per job.
    """
    kind = type(strategy)
    if kind is PostgresqlUuidStrategy:
        return _SUPPLIES.uuids
    if kind is MysqlUuidStrategy:
        return _SUPPLIES.mysql_uuids
    return None


class _Supplies(threading.local):
    """Each thread's id supplies: a generator must not run in two threads at once."""

    def __init__(self) -> None:
        self.renew()

    def renew(self) -> None:
        self.uuids = _random_uuids(as_bytes=False)
        self.mysql_uuids = _random_uuids(as_bytes=True)


def _random_uuids(*, as_bytes: bool) -> Iterator[tuple[uuid.UUID, Any]]:
    new, from_bytes, uuid_class = object.__new__, int.from_bytes, uuid.UUID
    # UUID is immutable (its __setattr__ refuses): its __init__ fills these two slots, and so does this.
    slots = vars(uuid_class)
    set_int, set_is_safe = slots["int"].__set__, slots["is_safe"].__set__
    unknown = uuid.SafeUUID.unknown
    while True:
        random = bytearray(os.urandom(16 * _RANDOM_BLOCK))
        random[6::16] = random[6::16].translate(_VERSION_4)
        random[8::16] = random[8::16].translate(_VARIANT_RFC_4122)
        block = bytes(random)
        for start in range(0, 16 * _RANDOM_BLOCK, 16):
            data = block[start : start + 16]
            job_id = new(uuid_class)
            set_int(job_id, from_bytes(data))
            set_is_safe(job_id, unknown)
            yield job_id, data if as_bytes else job_id


_SUPPLIES = _Supplies()
# A forked child would otherwise hand out the very ids its parent has still to hand out. Only the forking
# thread lives on in the child, and its supplies are made anew; threads started later make their own.
os.register_at_fork(after_in_child=_SUPPLIES.renew)
