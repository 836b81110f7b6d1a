package velocity.peer;

import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.math.BigDecimal;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.TreeMap;
import java.util.TreeSet;

/**
 * A Velocity rules file (SPEC §2) read as the backtest reads it, grouped by signature:
 * rules with the same grouping keys (as a set), filter and aggregated field (none for
 * COUNT) share one keyed state, as they share buckets in Velocity.
 *
 * <p>Only ACTIVE rules, each ruleId once, are taken (version 1, what `velocity backtest
 * --rules` gives a file's rules); anything else is refused with a message.
 */
public final class Rules {
    private Rules() {}

    public enum Aggregator { SUM, COUNT, AVG, MIN, MAX, UNIQUE_COUNT }

    public enum Operator { EQ, NE, GE, LE, GT, LT;

        boolean holds(int comparison) {
            switch (this) {
                case EQ: return comparison == 0;
                case NE: return comparison != 0;
                case GE: return comparison >= 0;
                case LE: return comparison <= 0;
                case GT: return comparison > 0;
                default: return comparison < 0;
            }
        }

        static Operator of(String spelled) {
            switch (spelled.toUpperCase(Locale.ROOT)) {
                case "=": case "EQUAL": case "EQ": return EQ;
                case "!=": case "NOT_EQUAL": case "NE": return NE;
                case ">=": case "GREATER_EQUAL": case "GTE": return GE;
                case "<=": case "LESS_EQUAL": case "LTE": return LE;
                case ">": case "GREATER": case "GT": return GT;
                case "<": case "LESS": case "LT": return LT;
                default: throw new IllegalArgumentException("unknown limitOperatorType " + spelled);
            }
        }
    }

    /** One rule in force. */
    public static final class Rule implements Serializable {
        public final int ruleId;
        public final int version = 1;
        public final Aggregator aggregator;
        public final Operator operator;
        public final BigDecimal limit;
        public final long windowMs;
        public final long cooldownMs;

        Rule(int ruleId, Aggregator aggregator, Operator operator, BigDecimal limit,
                long windowMs, long cooldownMs) {
            this.ruleId = ruleId;
            this.aggregator = aggregator;
            this.operator = operator;
            this.limit = limit;
            this.windowMs = windowMs;
            this.cooldownMs = cooldownMs;
        }
    }

    /** The rules of one signature with one window length: they read one running window. */
    public static final class WindowGroup implements Serializable {
        public final long windowMs;
        public final List<Rule> rules = new ArrayList<>();
        /** Index of each rule's cooldown slot in the key's state. */
        public final List<Integer> slots = new ArrayList<>();

        WindowGroup(long windowMs) {
            this.windowMs = windowMs;
        }
    }

    /** What decides a key's state: grouping keys, filter, aggregated field. */
    public static final class Signature implements Serializable {
        public final int index;
        public final int[] groupingFields; // indexes into EventParser.RULE_FIELDS, sorted by name
        public final int[] filterFields;
        public final String[][] filterValues;
        public final int field; // -1: none (COUNT)
        public final String text;
        public boolean needDistinct;
        public boolean needExtremes;
        public int rules;
        /** By window length, narrowest first: the widest evicts buckets from the state. */
        public final List<WindowGroup> windows = new ArrayList<>();

        Signature(int index, int[] groupingFields, int[] filterFields, String[][] filterValues,
                int field, String text) {
            this.index = index;
            this.groupingFields = groupingFields;
            this.filterFields = filterFields;
            this.filterValues = filterValues;
            this.field = field;
            this.text = text;
        }

        /** The event passes the filter: each named field equals one of its values. */
        public boolean passes(String[] values) {
            for (int i = 0; i < filterFields.length; i++) {
                String value = values[filterFields[i]];
                if (value == null || Arrays.binarySearch(filterValues[i], value) < 0) {
                    return false;
                }
            }
            return true;
        }
    }

    public static List<Signature> read(Path file) throws IOException {
        ObjectMapper mapper = new ObjectMapper()
                .enable(DeserializationFeature.USE_BIG_DECIMAL_FOR_FLOATS)
                .enable(DeserializationFeature.FAIL_ON_TRAILING_TOKENS);
        String text = Files.readString(file).trim();
        // As velocity.rules.decode_rules_text: one JSON value (an array of rules or one
        // rule), else JSON lines. The file is not validated here: `velocity rules validate`.
        List<JsonNode> entries = new ArrayList<>();
        JsonNode whole;
        try {
            whole = mapper.readTree(text);
        } catch (IOException notOneValue) {
            whole = null;
        }
        if (whole != null && whole.isArray()) {
            whole.forEach(entries::add);
        } else if (whole != null) {
            entries.add(whole);
        } else {
            for (String line : text.split("\n")) {
                if (!line.isBlank()) {
                    entries.add(mapper.readTree(line));
                }
            }
        }
        Map<String, Signature> bySignature = new TreeMap<>();
        Map<String, List<Rule>> rulesBySignature = new LinkedHashMap<>();
        TreeSet<Integer> seen = new TreeSet<>();
        List<Map.Entry<String, Rule>> ordered = new ArrayList<>();
        for (JsonNode entry : entries) {
            String state = entry.path("ruleState").asText("").toUpperCase(Locale.ROOT);
            int ruleId = entry.path("ruleId").asInt();
            if (!state.equals("ACTIVE")) {
                throw new IllegalArgumentException("rule " + ruleId + ": ruleState " + state
                        + " is not supported by the peer (ACTIVE rules only)");
            }
            if (!seen.add(ruleId)) {
                throw new IllegalArgumentException("ruleId " + ruleId
                        + " is given twice; the peer takes each ruleId once (version 1)");
            }
            Aggregator aggregator = Aggregator.valueOf(
                    entry.path("aggregatorFunctionType").asText().toUpperCase(Locale.ROOT));
            TreeSet<String> keys = new TreeSet<>();
            entry.path("groupingKeyNames").forEach(k -> keys.add(k.asText()));
            String fieldName = aggregator == Aggregator.COUNT
                    ? null : entry.path("aggregateFieldName").asText(null);
            TreeMap<String, TreeSet<String>> filter = new TreeMap<>();
            Iterator<Map.Entry<String, JsonNode>> fields = entry.path("filter").fields();
            while (fields.hasNext()) {
                Map.Entry<String, JsonNode> f = fields.next();
                TreeSet<String> allowed = new TreeSet<>();
                if (f.getValue().isArray()) {
                    f.getValue().forEach(v -> allowed.add(canonical(f.getKey(), v)));
                } else {
                    allowed.add(canonical(f.getKey(), f.getValue()));
                }
                filter.put(f.getKey(), allowed);
            }
            String signature = "keys=" + keys + " filter=" + filter + " field=" + fieldName;
            if (!bySignature.containsKey(signature)) {
                int[] grouping = keys.stream().mapToInt(Rules::fieldIndex).toArray();
                int[] filterFields = filter.keySet().stream().mapToInt(Rules::fieldIndex).toArray();
                String[][] filterValues = filter.values().stream()
                        .map(s -> s.toArray(new String[0])).toArray(String[][]::new);
                int field = fieldName == null ? -1 : fieldIndex(fieldName);
                bySignature.put(signature,
                        new Signature(0, grouping, filterFields, filterValues, field, signature));
            }
            Rule rule = new Rule(ruleId, aggregator,
                    Operator.of(entry.path("limitOperatorType").asText()),
                    entry.path("limit").decimalValue(),
                    entry.path("windowMinutes").asLong() * 60_000L,
                    entry.path("cooldownMinutes").asLong(0) * 60_000L);
            ordered.add(Map.entry(signature, rule));
        }
        List<Signature> out = new ArrayList<>();
        Map<String, Signature> indexed = new LinkedHashMap<>();
        for (Signature s : bySignature.values()) {
            Signature numbered = new Signature(out.size(), s.groupingFields, s.filterFields,
                    s.filterValues, s.field, s.text);
            indexed.put(s.text, numbered);
            out.add(numbered);
        }
        ordered.sort((a, b) -> Integer.compare(a.getValue().ruleId, b.getValue().ruleId));
        for (Map.Entry<String, Rule> e : ordered) {
            Signature s = indexed.get(e.getKey());
            Rule rule = e.getValue();
            WindowGroup group = null;
            for (WindowGroup g : s.windows) {
                if (g.windowMs == rule.windowMs) {
                    group = g;
                }
            }
            if (group == null) {
                group = new WindowGroup(rule.windowMs);
                s.windows.add(group);
                s.windows.sort((a, b) -> Long.compare(a.windowMs, b.windowMs));
            }
            group.rules.add(rule);
            group.slots.add(s.rules++);
            s.needDistinct |= rule.aggregator == Aggregator.UNIQUE_COUNT;
            s.needExtremes |= rule.aggregator == Aggregator.MIN || rule.aggregator == Aggregator.MAX;
        }
        return out;
    }

    private static int fieldIndex(String name) {
        int i = Arrays.asList(EventParser.RULE_FIELDS).indexOf(name);
        if (i < 0) {
            throw new IllegalArgumentException(name + " is not a declared event field");
        }
        return i;
    }

    /** A filter value as Velocity's canonical_value: text as is, numbers as their digits. */
    private static String canonical(String field, JsonNode value) {
        if (field.equals("paymentAmount")) {
            BigDecimal amount = value.isTextual()
                    ? new BigDecimal(value.asText().trim()) : value.decimalValue();
            return EventParser.formatDecimal(amount);
        }
        if (value.isTextual()) {
            return value.asText();
        }
        if (value.isIntegralNumber()) {
            return value.bigIntegerValue().toString();
        }
        return value.decimalValue().toString();
    }
}
