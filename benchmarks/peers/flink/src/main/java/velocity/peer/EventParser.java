package velocity.peer;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.regex.Pattern;

/**
 * One JSON line -> an accepted {@link Event}, or null when SPEC §1 quarantines it
 * (velocity.schema.parse_event_line's rules, token by token). Only the verdict and the
 * canonical values matter here; the reasons are not kept.
 *
 * <p>Canonical values as Velocity's: strings as they are, JSON integers as their digits
 * ("-0" is 0), JSON decimals as Python's str(Decimal) (Java's BigDecimal.toString follows
 * the same to-scientific-string rule), amounts normalised ("12.50" -> "12.5"). A declared
 * field given twice takes its last value, as Python's json does.
 */
public final class EventParser {
    /** The fields rules may name, in SPEC §1's order; Event.values follows it. */
    public static final String[] RULE_FIELDS = {
        "payerId", "beneficiaryId", "paymentAmount", "paymentType", "ip", "deviceId", "action"
    };
    public static final int AMOUNT = 2;

    private static final int TX = 7;
    private static final int TIME = 8;
    private static final int FIELDS = 9;

    private static final byte ABSENT = 0, NULL = 1, STRING = 2, INT = 3, FLOAT = 4, BOOL = 5,
            COMPOSITE = 6;

    // Python's \d is any Unicode decimal digit (Nd), and both Decimal and BigDecimal read them.
    private static final Pattern NUMERIC_STRING =
            Pattern.compile("[+-]?(\\p{Nd}+(\\.\\p{Nd}*)?|\\.\\p{Nd}+)([eE][+-]?\\p{Nd}+)?");
    private static final BigDecimal MAX_AMOUNT = BigDecimal.TEN.pow(18);
    private static final BigInteger MAX_EVENT_TIME = BigInteger.ONE.shiftLeft(62);

    private final JsonFactory json = new JsonFactory();
    private final byte[] kinds = new byte[FIELDS];
    private final String[] texts = new String[FIELDS];

    /** Blank lines carry no event: readers skip them (they are not quarantined). */
    public static boolean isBlank(String line) {
        for (int i = 0; i < line.length(); i++) {
            if (!isPythonSpace(line.charAt(i))) {
                return false;
            }
        }
        return true;
    }

    private static int fieldIndex(String name) {
        switch (name) {
            case "payerId": return 0;
            case "beneficiaryId": return 1;
            case "paymentAmount": return 2;
            case "paymentType": return 3;
            case "ip": return 4;
            case "deviceId": return 5;
            case "action": return 6;
            case "transactionId": return TX;
            case "eventTime": return TIME;
            default: return -1;
        }
    }

    /** The accepted event of a non-blank line, or null when it is quarantined. */
    public Event parse(String line) {
        if (!readTokens(line)) {
            return null;
        }
        // transactionId: a non-blank string or an integer.
        String tx;
        switch (kinds[TX]) {
            case STRING:
                if (isBlank(texts[TX]) || hasLoneSurrogate(texts[TX])) {
                    return null;
                }
                tx = texts[TX];
                break;
            case INT:
                tx = canonicalInt(texts[TX]);
                break;
            default:
                return null;
        }
        // eventTime: an integer in [0, 2^62).
        if (kinds[TIME] != INT || texts[TIME].length() > 20) {
            return null;
        }
        BigInteger time = new BigInteger(texts[TIME]);
        if (time.signum() < 0 || time.compareTo(MAX_EVENT_TIME) >= 0) {
            return null;
        }
        BigDecimal amount = amount(kinds[AMOUNT], texts[AMOUNT]);
        if (amount == null) {
            return null;
        }
        String[] values = new String[RULE_FIELDS.length];
        for (int i = 0; i < RULE_FIELDS.length; i++) {
            if (i == AMOUNT) {
                values[i] = formatDecimal(amount);
                continue;
            }
            byte kind = kinds[i];
            boolean required = i <= 3;
            if (kind == ABSENT || kind == NULL || (kind == STRING && isBlank(texts[i]))) {
                if (required) {
                    return null;
                }
                continue; // optional and absent: null
            }
            String text;
            switch (kind) {
                case STRING:
                    if (hasLoneSurrogate(texts[i])) {
                        return null;
                    }
                    text = texts[i];
                    break;
                case INT:
                    text = canonicalInt(texts[i]);
                    break;
                case FLOAT:
                    try {
                        text = decimalText(texts[i]);
                    } catch (NumberFormatException e) {
                        return null;
                    }
                    break;
                default:
                    return null; // a boolean, an object or an array
            }
            if (i == 3 && !(kind == STRING && (text.equals("CSH") || text.equals("CRD")))) {
                return null; // paymentType: CSH or CRD only
            }
            values[i] = text;
        }
        return new Event(tx, time.longValue(), amount, values);
    }

    /** Every declared field's JSON kind and text; false when the line is not one JSON object. */
    private boolean readTokens(String line) {
        java.util.Arrays.fill(kinds, ABSENT);
        java.util.Arrays.fill(texts, null);
        try (JsonParser p = json.createParser(line)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                return false;
            }
            JsonToken token;
            while ((token = p.nextToken()) != JsonToken.END_OBJECT) {
                int index = fieldIndex(p.currentName());
                token = p.nextToken();
                if (index < 0) {
                    p.skipChildren();
                    continue;
                }
                String text = null;
                byte kind;
                switch (token) {
                    case VALUE_STRING: kind = STRING; text = p.getText(); break;
                    case VALUE_NUMBER_INT: kind = INT; text = p.getText(); break;
                    case VALUE_NUMBER_FLOAT: kind = FLOAT; text = p.getText(); break;
                    case VALUE_NULL: kind = NULL; break;
                    case VALUE_TRUE:
                    case VALUE_FALSE: kind = BOOL; break;
                    default: kind = COMPOSITE; p.skipChildren(); break;
                }
                kinds[index] = kind;
                texts[index] = text;
            }
            return p.nextToken() == null; // nothing after the object
        } catch (IOException | RuntimeException e) {
            return false;
        }
    }

    /** paymentAmount: a number or numeric string, 0 <= amount < 10^18, at most 8 places. */
    private static BigDecimal amount(byte kind, String text) {
        BigDecimal value;
        try {
            switch (kind) {
                case STRING:
                    String stripped = pythonStrip(text);
                    if (!NUMERIC_STRING.matcher(stripped).matches()) {
                        return null;
                    }
                    value = new BigDecimal(stripped);
                    break;
                case INT:
                case FLOAT:
                    value = new BigDecimal(text);
                    break;
                default:
                    return null;
            }
        } catch (NumberFormatException | ArithmeticException e) {
            return null;
        }
        if (value.signum() < 0 || value.compareTo(MAX_AMOUNT) >= 0) {
            return null;
        }
        return value.stripTrailingZeros().scale() > 8 ? null : value;
    }

    /** A JSON decimal as Python's str(Decimal): BigDecimal's text, and "-0.0" keeps its sign. */
    static String decimalText(String json) {
        BigDecimal value = new BigDecimal(json);
        String text = value.toString();
        return value.signum() == 0 && json.startsWith("-") ? "-" + text : text;
    }

    /** A JSON integer's digits as Python's str(int) writes them ("-0" is "0"). */
    static String canonicalInt(String text) {
        return text.startsWith("-0") ? "0" : text;
    }

    /** Velocity's format_decimal: plain, no exponent, no trailing zeros; zero is "0". */
    public static String formatDecimal(BigDecimal value) {
        return value.signum() == 0 ? "0" : value.stripTrailingZeros().toPlainString();
    }

    /** Python's str.isspace for one UTF-16 unit (Java's isWhitespace leaves out a few). */
    private static boolean isPythonSpace(char c) {
        return Character.isWhitespace(c) || c == '\u00a0' || c == '\u2007' || c == '\u202f'
                || c == '\u0085';
    }

    private static String pythonStrip(String text) {
        int start = 0, end = text.length();
        while (start < end && isPythonSpace(text.charAt(start))) {
            start++;
        }
        while (end > start && isPythonSpace(text.charAt(end - 1))) {
            end--;
        }
        return text.substring(start, end);
    }

    /** JSON may spell an unpaired UTF-16 surrogate; Velocity rejects it as no text. */
    private static boolean hasLoneSurrogate(String text) {
        for (int i = 0; i < text.length(); i++) {
            char c = text.charAt(i);
            if (Character.isHighSurrogate(c)) {
                if (i + 1 < text.length() && Character.isLowSurrogate(text.charAt(i + 1))) {
                    i++;
                    continue;
                }
                return true;
            }
            if (Character.isLowSurrogate(c)) {
                return true;
            }
        }
        return false;
    }
}
