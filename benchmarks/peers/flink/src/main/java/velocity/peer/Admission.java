package velocity.peer;

import java.util.HashSet;
import org.apache.flink.api.common.functions.OpenContext;
import org.apache.flink.api.common.functions.RichFlatMapFunction;
import org.apache.flink.util.Collector;

/**
 * Parse and admit, one pass in arrival order (velocity.arrival, SPEC §1): a line that is
 * not a valid event, or whose eventTime is more than max_future ahead of the newest
 * accepted eventTime, is quarantined; otherwise the first arrival of a transactionId is
 * accepted and later ones are dropped as duplicates. Admission depends on the events
 * accepted before, so it runs at parallelism 1 on the lines in arrival order, as
 * Velocity's admission pass runs on one partition. Bounded job, no checkpoints: the set of
 * accepted ids is a plain field.
 */
public class Admission extends RichFlatMapFunction<String, Event> {
    private final long maxFutureMs;
    private transient EventParser parser;
    private transient HashSet<String> seen;
    private transient long newest;
    private transient long lines, accepted, quarantined, duplicates;
    private transient long opened;

    public Admission(long maxFutureMs) {
        this.maxFutureMs = maxFutureMs;
    }

    @Override
    public void open(OpenContext context) {
        parser = new EventParser();
        seen = new HashSet<>(1 << 21);
        newest = Long.MIN_VALUE;
        opened = System.nanoTime();
    }

    @Override
    public void flatMap(String line, Collector<Event> out) {
        if (EventParser.isBlank(line)) {
            return;
        }
        lines++;
        Event event = parser.parse(line);
        if (event == null
                || (newest != Long.MIN_VALUE && event.eventTime > newest + maxFutureMs)) {
            quarantined++;
            return;
        }
        if (!seen.add(event.transactionId)) {
            duplicates++;
            return;
        }
        newest = Math.max(newest, event.eventTime);
        accepted++;
        out.collect(event);
    }

    @Override
    public void close() {
        System.out.printf("peer: %d lines, %d accepted, %d quarantined, %d duplicates dropped; "
                + "read+parse+admit+fan-out %.1f s%n", lines, accepted, quarantined, duplicates,
                (System.nanoTime() - opened) / 1e9);
    }
}
