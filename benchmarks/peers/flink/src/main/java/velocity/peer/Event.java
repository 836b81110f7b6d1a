package velocity.peer;

import java.math.BigDecimal;

/**
 * An accepted event (SPEC §1): its identity, time and amount, and the canonical string of
 * every field a rule may name ({@link EventParser#RULE_FIELDS}; null where absent).
 */
public class Event {
    public String transactionId;
    public long eventTime;
    public BigDecimal amount;
    public String[] values;

    public Event() {}

    public Event(String transactionId, long eventTime, BigDecimal amount, String[] values) {
        this.transactionId = transactionId;
        this.eventTime = eventTime;
        this.amount = amount;
        this.values = values;
    }
}
