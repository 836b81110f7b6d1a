package velocity.peer;

import java.math.BigDecimal;
import java.util.HashMap;

/**
 * One g-wide bucket of one (signature, key), as Velocity's BucketAggregate: the events'
 * count, the count of non-null field values, the numeric values' count, sum, min and max,
 * and (for signatures a UNIQUE_COUNT rule reads) each distinct value's count.
 */
public class Bucket {
    public long count;
    public long valueCount;
    public long numericCount;
    public BigDecimal sum;
    public BigDecimal min;
    public BigDecimal max;
    public HashMap<String, Integer> distinct;

    public Bucket() {}

    void add(KeyedEvent e, boolean keepDistinct) {
        count++;
        if (e.value == null) {
            return;
        }
        valueCount++;
        if (keepDistinct) {
            if (distinct == null) {
                distinct = new HashMap<>();
            }
            distinct.merge(e.value, 1, Integer::sum);
        }
        BigDecimal x = e.number;
        if (x != null) {
            numericCount++;
            sum = sum == null ? x : sum.add(x);
            min = min == null || x.compareTo(min) < 0 ? x : min;
            max = max == null || x.compareTo(max) > 0 ? x : max;
        }
    }
}
