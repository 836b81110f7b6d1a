package velocity.peer;

import java.math.BigDecimal;
import java.util.ArrayDeque;
import java.util.HashMap;
import java.util.Map;

/**
 * The aggregate of one key's buckets whose start is at or above the window's lower edge,
 * for one window length: the events of a key are decided in eventTime order, so every
 * event added so far is at or below the deciding event's time, and the window
 * [floor_g(t - W), t] is exactly "the buckets from floor_g(t - W) on". Buckets enter as
 * their events are added and leave whole when the lower edge passes them (subtracted
 * with the figures kept in the bucket state). MIN and MAX keep a monotonic deque of
 * (bucket start, value), so each is O(1) amortized per event, like Velocity's
 * prefix sums and segmented reductions over sorted buckets.
 */
public class RunningWindow {
    public long count;
    public long valueCount;
    public long numericCount;
    public BigDecimal total;
    public HashMap<String, Integer> distinct;
    /** Starts of the buckets inside, oldest first. */
    public ArrayDeque<Long> starts = new ArrayDeque<>();
    public ArrayDeque<Object[]> mins;
    public ArrayDeque<Object[]> maxs;

    public RunningWindow() {}

    RunningWindow(boolean needDistinct, boolean needExtremes) {
        if (needDistinct) {
            distinct = new HashMap<>();
        }
        if (needExtremes) {
            mins = new ArrayDeque<>();
            maxs = new ArrayDeque<>();
        }
    }

    void add(KeyedEvent e, long bucketStart) {
        Long last = starts.peekLast();
        if (last == null || last != bucketStart) {
            starts.addLast(bucketStart);
        }
        count++;
        if (e.value == null) {
            return;
        }
        valueCount++;
        if (distinct != null) {
            distinct.merge(e.value, 1, Integer::sum);
        }
        BigDecimal x = e.number;
        if (x == null) {
            return;
        }
        numericCount++;
        total = total == null ? x : total.add(x);
        if (mins != null) {
            while (!mins.isEmpty() && ((BigDecimal) mins.peekLast()[1]).compareTo(x) >= 0) {
                mins.pollLast();
            }
            mins.addLast(new Object[] {bucketStart, x});
            while (!maxs.isEmpty() && ((BigDecimal) maxs.peekLast()[1]).compareTo(x) <= 0) {
                maxs.pollLast();
            }
            maxs.addLast(new Object[] {bucketStart, x});
        }
    }

    /** Moves the lower edge to {@code lower}: the buckets below leave. Returns how many. */
    int evictBelow(long lower, Buckets buckets) throws Exception {
        int n = 0;
        while (!starts.isEmpty() && starts.peekFirst() < lower) {
            long start = starts.pollFirst();
            Bucket b = buckets.get(start);
            count -= b.count;
            valueCount -= b.valueCount;
            numericCount -= b.numericCount;
            if (b.numericCount > 0) {
                total = numericCount == 0 ? null : total.subtract(b.sum);
            }
            if (distinct != null && b.distinct != null) {
                for (Map.Entry<String, Integer> d : b.distinct.entrySet()) {
                    int left = distinct.get(d.getKey()) - d.getValue();
                    if (left == 0) {
                        distinct.remove(d.getKey());
                    } else {
                        distinct.put(d.getKey(), left);
                    }
                }
            }
            buckets.evicted(start);
            n++;
        }
        if (mins != null) {
            while (!mins.isEmpty() && (Long) mins.peekFirst()[0] < lower) {
                mins.pollFirst();
            }
            while (!maxs.isEmpty() && (Long) maxs.peekFirst()[0] < lower) {
                maxs.pollFirst();
            }
        }
        return n;
    }

    /** The key's bucket state, as the window reads it while its lower edge moves. */
    interface Buckets {
        Bucket get(long start) throws Exception;

        /** {@code start} left this window. */
        void evicted(long start) throws Exception;
    }

    BigDecimal minimum() {
        return mins.isEmpty() ? null : (BigDecimal) mins.peekFirst()[1];
    }

    BigDecimal maximum() {
        return maxs.isEmpty() ? null : (BigDecimal) maxs.peekFirst()[1];
    }
}
