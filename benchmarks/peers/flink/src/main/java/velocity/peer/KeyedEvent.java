package velocity.peer;

import java.math.BigDecimal;

/**
 * One event as one rule signature sees it (Velocity's keyed row): the signature, the
 * dynamic key, the time and identity, the aggregated field's canonical value (null when
 * absent, or for COUNT) and its number (the amount, when the field is paymentAmount).
 * A POJO, so Flink serializes it with its PojoSerializer across the keyBy.
 */
public class KeyedEvent {
    public int signature;
    /** signature index, a separator, the key's values as a JSON array: the keyBy key. */
    public String key;
    public long eventTime;
    public String transactionId;
    public String value;
    public BigDecimal number;

    public KeyedEvent() {}
}
