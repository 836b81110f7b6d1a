package velocity.peer;

import java.math.BigDecimal;
import java.math.RoundingMode;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Comparator;
import java.util.List;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.state.MapState;
import org.apache.flink.api.common.state.MapStateDescriptor;
import org.apache.flink.api.common.state.ValueState;
import org.apache.flink.api.common.state.ValueStateDescriptor;
import org.apache.flink.api.common.typeinfo.TypeHint;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.streaming.api.functions.KeyedProcessFunction;
import org.apache.flink.util.Collector;

/**
 * The per-event custom window of SPEC §3 for one (signature, key), keyed state only:
 *
 * <ul>
 *   <li>{@code pending}: the key's events by eventTime, each time with one event-time timer.
 *       Timers fire in timestamp order, so the key's events are decided in eventTime order
 *       whatever order they arrived in, and all events of one eventTime together (they see
 *       each other: the window's upper edge is inclusive).
 *   <li>{@code buckets}: g-wide buckets by start (count, value count, sum, min, max, distinct
 *       values), the state of record, evicted once below the widest window.
 *   <li>{@code windows}: a running window per window length over the buckets from
 *       floor_g(t - W) on, and the cooldown's last notified eventTime per rule.
 * </ul>
 *
 * <p>An event at t fires rule r when aggregate OP limit holds over the window
 * [floor_g(t - W), t]; AVG is judged as total OP limit x count, exactly, and shown rounded
 * half-even to 8 places. Alerts of one time go out in transactionId order, which is the
 * cooldown's order: (eventTime, transactionId) per rule and key.
 */
public class WindowEvaluator extends KeyedProcessFunction<String, KeyedEvent, String> {
    private static final int AVG_PLACES = 8;
    /** transactionIds in Python's order (by code point; String.compareTo is by UTF-16 unit). */
    private static final Comparator<KeyedEvent> BY_TRANSACTION_ID = (a, b) -> {
        String x = a.transactionId, y = b.transactionId;
        int i = 0, j = 0;
        while (i < x.length() && j < y.length()) {
            int cx = x.codePointAt(i), cy = y.codePointAt(j);
            if (cx != cy) {
                return Integer.compare(cx, cy);
            }
            i += Character.charCount(cx);
            j += Character.charCount(cy);
        }
        return Boolean.compare(i < x.length(), j < y.length());
    };

    private final List<Rules.Signature> signatures;
    private final long widthMs;

    private transient MapState<Long, List<KeyedEvent>> pending;
    private transient MapState<Long, Bucket> buckets;
    private transient ValueState<KeyState> state;
    private transient StringBuilder line;

    public WindowEvaluator(List<Rules.Signature> signatures, long widthMs) {
        this.signatures = signatures;
        this.widthMs = widthMs;
    }

    @Override
    public void open(OpenContext context) {
        pending = getRuntimeContext().getMapState(new MapStateDescriptor<>(
                "pending", Types.LONG, Types.LIST(TypeInformation.of(KeyedEvent.class))));
        buckets = getRuntimeContext().getMapState(new MapStateDescriptor<>(
                "buckets", Types.LONG, TypeInformation.of(Bucket.class)));
        state = getRuntimeContext().getState(new ValueStateDescriptor<>(
                "windows", TypeInformation.of(new TypeHint<KeyState>() {})));
        line = new StringBuilder(256);
    }

    @Override
    public void processElement(KeyedEvent event, Context ctx, Collector<String> out)
            throws Exception {
        List<KeyedEvent> same = pending.get(event.eventTime);
        if (same == null) {
            same = new ArrayList<>(2);
            ctx.timerService().registerEventTimeTimer(event.eventTime);
        }
        same.add(event);
        pending.put(event.eventTime, same);
    }

    @Override
    public void onTimer(long time, OnTimerContext ctx, Collector<String> out) throws Exception {
        List<KeyedEvent> tied = pending.get(time);
        pending.remove(time);
        Rules.Signature signature = signatures.get(tied.get(0).signature);
        KeyState key = state.value();
        if (key == null) {
            key = new KeyState();
            key.windows = new RunningWindow[signature.windows.size()];
            for (int i = 0; i < key.windows.length; i++) {
                key.windows[i] = new RunningWindow(signature.needDistinct, signature.needExtremes);
            }
            key.lastNotified = new long[signature.rules];
            Arrays.fill(key.lastNotified, Long.MIN_VALUE);
        }
        long own = floor(time);
        Bucket bucket = buckets.get(own);
        if (bucket == null) {
            bucket = new Bucket();
        }
        for (KeyedEvent e : tied) {
            bucket.add(e, signature.needDistinct);
            for (RunningWindow w : key.windows) {
                w.add(e, own);
            }
        }
        buckets.put(own, bucket);
        if (tied.size() > 1) {
            tied.sort(BY_TRANSACTION_ID);
        }
        int last = key.windows.length - 1;
        for (int i = 0; i <= last; i++) {
            Rules.WindowGroup group = signature.windows.get(i);
            RunningWindow window = key.windows[i];
            long lower = floor(time - group.windowMs);
            boolean widest = i == last;
            window.evictBelow(lower, new RunningWindow.Buckets() {
                @Override
                public Bucket get(long start) throws Exception {
                    return buckets.get(start);
                }

                @Override
                public void evicted(long start) throws Exception {
                    if (widest) { // below every window now: the bucket is no longer needed
                        buckets.remove(start);
                    }
                }
            });
            for (int r = 0; r < group.rules.size(); r++) {
                Rules.Rule rule = group.rules.get(r);
                BigDecimal value = fired(rule, window);
                if (value == null) {
                    continue;
                }
                String shown = EventParser.formatDecimal(value);
                int slot = group.slots.get(r);
                for (KeyedEvent e : tied) {
                    boolean notified = rule.cooldownMs <= 0
                            || key.lastNotified[slot] == Long.MIN_VALUE
                            || e.eventTime >= key.lastNotified[slot] + rule.cooldownMs;
                    if (notified && rule.cooldownMs > 0) {
                        key.lastNotified[slot] = e.eventTime;
                    }
                    out.collect(alert(rule, e, shown, lower, !notified));
                }
            }
        }
        state.update(key);
    }

    /** The rule's aggregate when aggregate OP limit holds over the window, else null. */
    static BigDecimal fired(Rules.Rule rule, RunningWindow w) {
        BigDecimal value;
        switch (rule.aggregator) {
            case COUNT:
                value = BigDecimal.valueOf(w.count);
                break;
            case UNIQUE_COUNT:
                value = BigDecimal.valueOf(w.distinct.size());
                break;
            case SUM:
                value = w.total;
                break;
            case MIN:
                value = w.minimum();
                break;
            case MAX:
                value = w.maximum();
                break;
            default: // AVG, judged exactly as total OP limit x count
                if (w.total == null || w.valueCount == 0) {
                    return null;
                }
                BigDecimal count = BigDecimal.valueOf(w.valueCount);
                if (!rule.operator.holds(w.total.compareTo(rule.limit.multiply(count)))) {
                    return null;
                }
                return w.total.divide(count, AVG_PLACES, RoundingMode.HALF_EVEN);
        }
        return value != null && rule.operator.holds(value.compareTo(rule.limit)) ? value : null;
    }

    private String alert(Rules.Rule rule, KeyedEvent e, String value, long windowStart,
            boolean suppressed) {
        StringBuilder b = line;
        b.setLength(0);
        b.append("{\"ruleId\":").append(rule.ruleId)
                .append(",\"ruleVersion\":").append(rule.version)
                .append(",\"transactionId\":");
        Json.string(b, e.transactionId);
        b.append(",\"key\":");
        Json.string(b, e.key.substring(e.key.indexOf(FanOut.SEPARATOR) + 1));
        b.append(",\"eventTime\":").append(e.eventTime)
                .append(",\"aggregatorFunctionType\":\"").append(rule.aggregator.name())
                .append("\",\"aggregateValue\":\"").append(value)
                .append("\",\"windowStart\":").append(windowStart)
                .append(",\"windowEnd\":").append(e.eventTime);
        if (suppressed) {
            b.append(",\"suppressed\":true");
        }
        return b.append('}').toString();
    }

    private long floor(long v) {
        return v - Math.floorMod(v, widthMs);
    }
}
