package velocity.peer;

import java.util.List;
import org.apache.flink.api.common.functions.FlatMapFunction;
import org.apache.flink.util.Collector;

/**
 * Each accepted event to each signature whose filter it passes and whose grouping fields it
 * has (dynamic keys, as in Flink's fraud-detection demo): an event without a value for a
 * grouping field is not decided by that signature's rules, as in Velocity.
 */
public class FanOut implements FlatMapFunction<Event, KeyedEvent> {
    /** Between the signature's index and the key's JSON text in the keyBy key. */
    public static final char SEPARATOR = '|';

    private final List<Rules.Signature> signatures;

    public FanOut(List<Rules.Signature> signatures) {
        this.signatures = signatures;
    }

    @Override
    public void flatMap(Event event, Collector<KeyedEvent> out) {
        String[] values = event.values;
        StringBuilder key = new StringBuilder(64);
        signatures:
        for (Rules.Signature s : signatures) {
            if (!s.passes(values)) {
                continue;
            }
            key.setLength(0);
            key.append(s.index).append(SEPARATOR).append('[');
            for (int i = 0; i < s.groupingFields.length; i++) {
                String value = values[s.groupingFields[i]];
                if (value == null) {
                    continue signatures;
                }
                if (i > 0) {
                    key.append(',');
                }
                Json.string(key, value);
            }
            KeyedEvent keyed = new KeyedEvent();
            keyed.signature = s.index;
            keyed.key = key.append(']').toString();
            keyed.eventTime = event.eventTime;
            keyed.transactionId = event.transactionId;
            if (s.field >= 0) {
                keyed.value = values[s.field];
                keyed.number = s.field == EventParser.AMOUNT ? event.amount : null;
            }
            out.collect(keyed);
        }
    }
}
