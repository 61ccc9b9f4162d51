"""Size and byte clauses: a payload is stored whole or refused, and its text round-trips byte for byte."""

from __future__ import annotations

import contextlib
import json
from typing import Any, Final

import pytest

from conformance.base import SuiteBase
from conformance.clocks import EPOCH, frozen
from conformance.contract import VerbatimSerializer
from conformance.harness import Harness
from conformance.sessions import need
from proletarian_ref import errors
from proletarian_ref.backend import STATUS_SUCCESS
from proletarian_ref.job import default_serializer, enqueue
from proletarian_ref.keywords import DEFAULT_QUEUE, to_keyword_text

DEFAULT_QUEUE_TEXT: Final = to_keyword_text(DEFAULT_QUEUE, what="queue")
# Every class of character a payload's Transit text can hold, by name (the names are the map's keys).
CHARACTER_CLASSES: Final = {
    "ascii": "plain text 0123456789",
    "latin-1": "äöüß éñ ¡¿ ©",
    "bmp": "ǅ नमस्ते 中文 \ufeff \ufffd",
    "astral": "😀 𝄞 🀄 \U0010fffd",
    "controls": "\x00\x01\x07\x08\t\n\x0b\x0c\r\x1b\x7f\x80\x9f",
    "line separators": "\u2028 \u2029 \u0085",
    "combining (NFD)": "e\u0301 n\u0303 A\u030a",
    "slashes": "/ // \\ \\\\ </script>",
    "quotes": '" \' ` ""',
    "transit escapes": ["~", "^", "`", "~:kw", "^ ", "~#tag", "~~", "^^", "`~", "~i1", "~$sym"],
}
# Transit of a string: ["~#'","<body>"], ten ASCII bytes around the body.
_QUOTED_AROUND: Final = len('["~#\'",""]')


def transit_text_of(size: int) -> str:
    """Transit text of one string, exactly `size` UTF-8 bytes, mostly 4-byte characters."""
    body = size - _QUOTED_AROUND
    text = '["~#\'","' + "😀" * (body // 4) + "a" * (body % 4) + '"]'
    assert len(text.encode("utf-8")) == size
    return text


def first_difference(expected: str, actual: str) -> str:
    """Where two texts part, with a little of each around it."""
    at = next((i for i, (a, b) in enumerate(zip(expected, actual, strict=False)) if a != b), None)
    if at is None:
        at = min(len(expected), len(actual))
    return f"at character {at}: expected {expected[at : at + 12]!r}, got {actual[at : at + 12]!r}"


class PayloadTests(SuiteBase):
    """Payload text in, the same bytes out: never truncated, never re-encoded, never mangled."""

    __test__ = False

    def _enqueue_text(self, harness: Harness, conn: Any, text: str) -> Any:
        return enqueue(
            conn,
            "conformance/job",
            None,
            job_table=harness.job_table,
            serializer=VerbatimSerializer(text),
            job_id_strategy=harness.job_id_strategy(),
            clock=frozen(EPOCH),
            backend=harness.backend(),
            **harness.enqueue_options,
        )

    def test_a_payload_at_the_column_limit_is_stored_and_one_byte_over_is_refused(
        self, harness: Harness
    ) -> None:
        """B1: a payload of exactly the column's limit round-trips; one byte over raises and writes nothing.

        The error is the library's (PayloadTooLargeError where the library has it), raised by enqueue;
        the job table stays as it was and nothing is stored truncated, whatever the caller does next.
        """
        limit = harness.payload_limit_bytes
        if limit is None:
            pytest.skip(f"{harness.name}: the payload column has no size limit worth testing")
        need(harness, "payload_bytes")
        fits = transit_text_of(limit)
        self.enqueue_job(harness, EPOCH, serializer=VerbatimSerializer(fits))
        stored, _ = harness.payload_bytes()
        assert stored == [fits.encode("utf-8")], "B1: a payload at the column's limit was not stored whole"
        assert self.run_next(harness, frozen(EPOCH), lambda job_type, payload: None) is True
        _, archived = harness.payload_bytes()
        assert archived == [fits.encode("utf-8")], "B1: the archive did not keep a payload at the limit whole"
        expected: type[Exception] = getattr(errors, "PayloadTooLargeError", errors.ProletarianError)
        conn = harness.connect()
        try:
            try:
                self._enqueue_text(harness, conn, transit_text_of(limit + 1))
            except expected:
                pass
            except Exception as exc:
                pytest.fail(
                    f"B1: enqueue of a payload one byte over the limit raised {type(exc).__name__}: {exc}; "
                    f"expected {expected.__name__}"
                )
            else:
                pytest.fail(
                    f"B1: enqueue took a payload one byte over the limit without raising {expected.__name__}"
                )
            # An aborted transaction may refuse the commit; what matters is what it left in the table.
            with contextlib.suppress(Exception):
                conn.commit()
        finally:
            conn.close()
        stored, _ = harness.payload_bytes()
        assert stored == [], (
            f"B1: a payload over the limit was stored anyway, as {[len(s) for s in stored]} bytes"
        )

    def test_every_character_class_round_trips_byte_for_byte_through_claim_and_archive(
        self, harness: Harness
    ) -> None:
        """B2: the Transit text of every character class is stored, claimed and archived as the same bytes.

        Non-ASCII in and out of the BMP, control characters, U+2028/9, combining marks, slashes, quotes,
        backslashes and Transit's escape prefixes ~ ^ `: the stored and archived payload bytes are the
        UTF-8 of the text enqueue wrote, and the claim returns that very text. Twice: the serializer's
        text (which, as Proletarian's, escapes characters outside the BMP) and the same payload as raw
        UTF-8, as another writer may store it.
        """
        job_table, archived_job_table = self.tables(harness)
        serializer = default_serializer()
        payload = dict(CHARACTER_CLASSES)
        escaped = serializer.encode(payload)
        raw = json.dumps(json.loads(escaped), ensure_ascii=False, separators=(",", ":"))
        backend = harness.backend()
        for kind, text in (("the serializer's", escaped), ("raw UTF-8", raw)):
            harness.clear()
            self.enqueue_job(harness, EPOCH, serializer=VerbatimSerializer(text))
            if harness.supports("payload_bytes"):
                stored, _ = harness.payload_bytes()
                assert stored == [text.encode("utf-8")], f"B2 ({kind}): the stored bytes are not the text"
            with backend.transaction() as conn:
                job = backend.get_next_job(conn, job_table, DEFAULT_QUEUE_TEXT, EPOCH)
                assert job is not None
                assert job.payload == text, (
                    f"B2 ({kind}): the claimed payload text differs: {first_difference(text, job.payload)}"
                )
                assert serializer.decode(job.payload) == payload
                backend.archive_job(conn, job_table, archived_job_table, job.job_id, STATUS_SUCCESS, EPOCH)
                backend.delete_job(conn, job_table, job.job_id)
            assert self.only_archived(harness).payload == text, f"B2 ({kind}): the archived text differs"
            if harness.supports("payload_bytes"):
                _, archived = harness.payload_bytes()
                assert archived == [text.encode("utf-8")], f"B2 ({kind}): the archived bytes are not the text"
