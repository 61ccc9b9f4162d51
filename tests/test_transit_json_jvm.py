"""Our JSON text against Jackson itself: tests/jvm/JacksonOracle.java run on this machine's JVM.

The oracle drives jackson-core's public JsonGenerator the way transit-java's JsonEmitter does (see its
header). Needs ``javac``/``java`` and jackson-core 2.14 (Debian: libjackson2-core-java; ci/test.sh
installs it); PROLETARIAN_JACKSON_JAR points elsewhere. In CI a missing JVM fails the run.

Doubles: we follow JDK 19+ Double.toString (shortest digits, Raffaello Giulietti's algorithm), which
Jackson 2.14 also ships as its USE_FAST_DOUBLE_WRITER; every double must match it. JDK 17 and earlier
spell a double differently: more digits than needed (1.37342863480957901E18 for 1.373428634809579E18),
as many but not the closest (2.9449184051115122E25 for 2.9449184051115123E25), or one digit where JDK 19
picks the closer two (1.0E-323 for 9.9E-324). Those, and only those, may differ from this JVM's
Double.toString: the test checks that each is the same double with other digits, never another layout.
"""

from __future__ import annotations

import os
import random
import shutil
import struct
import subprocess
import threading
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from transit_support import DECIMALS_JAVA_REFUSES

from proletarian_ref.errors import SerializationError
from proletarian_ref.serializers import TransitSerializer
from proletarian_ref.transit_json import big_decimal_text, double_text, string_text

pytestmark = pytest.mark.jvm

JAR_ENV = "PROLETARIAN_JACKSON_JAR"
SOURCE = Path(__file__).resolve().parent / "jvm" / "JacksonOracle.java"


class Oracle:
    """One JVM answering one request line at a time (see JacksonOracle.java for the protocol)."""

    def __init__(self, classpath: str) -> None:
        self._process = subprocess.Popen(
            ["java", "-cp", classpath, "JacksonOracle"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            encoding="ascii",
        )

    def ask(self, requests: list[str]) -> list[str]:
        assert self._process.stdin is not None and self._process.stdout is not None
        stdin = self._process.stdin

        def send() -> None:
            # From a thread: answers are read while requests are still being written.
            stdin.write("".join(request + "\n" for request in requests))
            stdin.flush()

        sender = threading.Thread(target=send)
        sender.start()
        answers = [self._process.stdout.readline().rstrip("\n") for _ in requests]
        sender.join()
        assert all(answers), "the JVM oracle stopped answering"
        return answers

    def close(self) -> None:
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait(timeout=30)


@pytest.fixture(scope="module")
def oracle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Oracle]:
    jar = Path(os.environ.get(JAR_ENV, "/usr/share/java/jackson-core.jar"))
    missing = [tool for tool in ("java", "javac") if shutil.which(tool) is None]
    if missing or not jar.is_file():
        message = (
            f"the Jackson oracle needs a JDK ({', '.join(missing) or 'found'}) and jackson-core at {jar} "
            f"(apt-get install libjackson2-core-java, or set {JAR_ENV})"
        )
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip("!!! JACKSON ORACLE NOT RUN !!! " + message)
    classes = tmp_path_factory.mktemp("jackson-oracle")
    subprocess.run(["javac", "-d", str(classes), "-cp", str(jar), str(SOURCE)], check=True)
    running = Oracle(f"{classes}{os.pathsep}{jar}")
    yield running
    running.close()


def string_request(value: str) -> str:
    return "S " + value.encode("utf-16-be", "surrogatepass").hex()


def double_request(value: float) -> str:
    return "D " + struct.pack(">d", value).hex()


def significant_digits(text: str) -> str:
    mantissa = text.lstrip("-").partition("E")[0].replace(".", "")
    return mantissa.strip("0")


def assert_double_as_java_writes_it(value: float, answer: str) -> None:
    jvm_text, jdk19_text = answer.split("\t")
    ours = double_text(value)
    assert ours == jdk19_text, value
    if ours != jvm_text:
        # Only JDK <= 18's known slips (see the module docstring): another spelling of the same double.
        assert float(jvm_text) == value, (value, jvm_text)
        assert significant_digits(jvm_text) != significant_digits(ours), (value, jvm_text)


# Any code point, lone surrogates included (Python strs and Java Strings can both hold them).
ANY_TEXT = st.text(st.characters(exclude_categories=()))


@given(ANY_TEXT)
def test_strings_are_escaped_as_jackson_writes_them(oracle: Oracle, value: str) -> None:
    [answer] = oracle.ask([string_request(value)])
    assert string_text(value).encode("utf-8") == bytes.fromhex(answer)


def test_every_bmp_code_unit_and_a_sample_beyond_is_escaped_as_jackson_writes_it(oracle: Oracle) -> None:
    values = [chr(code) for code in range(0x10000)] + [chr(code) for code in range(0x10000, 0x110000, 97)]
    values.append("a\ud83d\ude00b")  # a pair Python holds as two lone surrogates: the same two escapes
    answers = oracle.ask([string_request(value) for value in values])
    for value, answer in zip(values, answers, strict=True):
        assert string_text(value).encode("utf-8") == bytes.fromhex(answer), hex(ord(value[0]))


@given(st.floats(allow_nan=False, allow_infinity=False))
def test_doubles_are_written_as_jackson_and_double_to_string_write_them(oracle: Oracle, value: float) -> None:
    [answer] = oracle.ask([double_request(value)])
    assert_double_as_java_writes_it(value, answer)


def test_many_doubles_are_written_as_jackson_and_double_to_string_write_them(oracle: Oracle) -> None:
    generator = random.Random(20260603)
    values = [struct.unpack(">d", generator.getrandbits(64).to_bytes(8, "big"))[0] for _ in range(20000)]
    values = [value for value in values if value - value == 0.0]  # finite only
    values += [k * 5e-324 for k in range(1, 2000)]  # subnormals with few significant bits
    values += [2.0**exponent for exponent in range(-1074, 1024)]
    values += [float(f"1e{exponent}") for exponent in range(-323, 309)]
    values += [1e-3, 1e7, 0.0009999999999999998, 9999999.999999998, 0.0, -0.0, 2.2250738585072014e-308]
    answers = oracle.ask([double_request(value) for value in values])
    for value, answer in zip(values, answers, strict=True):
        assert_double_as_java_writes_it(value, answer)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_longs_are_written_as_jackson_writes_them(oracle: Oracle, value: int) -> None:
    assert oracle.ask([f"L {value}"]) == [str(value)]


@given(st.decimals(allow_nan=False, allow_infinity=False))
def test_decimals_are_written_as_big_decimal_to_string(oracle: Oracle, value: Decimal) -> None:
    exponent = value.as_tuple().exponent
    assert isinstance(exponent, int)
    assume(abs(exponent) < 2**30)  # a BigDecimal's scale is a Java int
    assert oracle.ask([f"B {value}"]) == [big_decimal_text(value)]


@pytest.mark.parametrize("text", ["1E+2147483647", "1E-2147483647", "12E-2147483647", *DECIMALS_JAVA_REFUSES])
def test_we_refuse_exactly_the_decimals_at_the_edge_that_big_decimal_refuses(
    oracle: Oracle, text: str
) -> None:
    [answer] = oracle.ask([f"B {text}"])
    if answer.startswith("refused: "):
        with pytest.raises(SerializationError, match="beyond Java's BigDecimal"):
            TransitSerializer().encode(Decimal(text))
    else:
        assert TransitSerializer().encode(Decimal(text)) == f'["~#\'","~f{answer}"]'
