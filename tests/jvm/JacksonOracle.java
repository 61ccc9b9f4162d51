// The JSON text Jackson writes on this JVM, for tests/test_transit_json_jvm.py to compare ours with.
// It drives Jackson's public JsonGenerator API the way transit-java's JsonEmitter does: a generator from
// new JsonFactory().createGenerator(OutputStream), then writeString / writeNumber(double) / writeNumber(long).
//
// One request per stdin line, one answer per stdout line (flushed, so a test can ask one at a time):
//   S <UTF-16 code units, 4 hex digits each>  ->  hex of the UTF-8 bytes writeString produced
//   D <IEEE 754 bits, 16 hex digits>          ->  writeNumber(double) text, TAB, the same with
//                                                 StreamWriteFeature.USE_FAST_DOUBLE_WRITER (Schubfach,
//                                                 the algorithm of JDK 19+ Double.toString)
//   L <decimal long>                          ->  writeNumber(long) text
//   B <decimal text>                          ->  new BigDecimal(text).toString(), or "refused: ..."

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.StreamWriteFeature;
import java.io.BufferedReader;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.PrintStream;
import java.math.BigDecimal;
import java.nio.charset.StandardCharsets;

public final class JacksonOracle {
    private static final JsonFactory PLAIN = new JsonFactory();
    private static final JsonFactory FAST =
            JsonFactory.builder().enable(StreamWriteFeature.USE_FAST_DOUBLE_WRITER).build();

    private interface Write {
        void to(JsonGenerator generator) throws IOException;
    }

    private static byte[] written(JsonFactory factory, Write write) throws IOException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (JsonGenerator generator = factory.createGenerator(out)) {
            write.to(generator);
        }
        return out.toByteArray();
    }

    private static String ascii(byte[] bytes) {
        return new String(bytes, StandardCharsets.US_ASCII);
    }

    private static String hex(byte[] bytes) {
        StringBuilder text = new StringBuilder(bytes.length * 2);
        for (byte b : bytes) {
            text.append(String.format("%02x", b & 0xFF));
        }
        return text.toString();
    }

    private static String answer(String line) throws IOException {
        String argument = line.substring(2);
        switch (line.charAt(0)) {
            case 'S': {
                char[] units = new char[argument.length() / 4];
                for (int i = 0; i < units.length; i++) {
                    units[i] = (char) Integer.parseInt(argument.substring(4 * i, 4 * i + 4), 16);
                }
                String value = new String(units);
                return hex(written(PLAIN, g -> g.writeString(value)));
            }
            case 'D': {
                double value = Double.longBitsToDouble(Long.parseUnsignedLong(argument, 16));
                return ascii(written(PLAIN, g -> g.writeNumber(value))) + "\t"
                        + ascii(written(FAST, g -> g.writeNumber(value)));
            }
            case 'L': {
                long value = Long.parseLong(argument);
                return ascii(written(PLAIN, g -> g.writeNumber(value)));
            }
            case 'B':
                try {
                    return new BigDecimal(argument).toString();
                } catch (NumberFormatException refused) {
                    return "refused: " + refused.getMessage();
                }
            default:
                throw new IllegalArgumentException("unknown request: " + line);
        }
    }

    public static void main(String[] args) throws IOException {
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        PrintStream out = new PrintStream(System.out, false, StandardCharsets.US_ASCII);
        for (String line = in.readLine(); line != null; line = in.readLine()) {
            out.println(answer(line));
            out.flush();
        }
    }
}
