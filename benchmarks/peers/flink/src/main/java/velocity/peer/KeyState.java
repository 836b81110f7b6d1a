package velocity.peer;

/**
 * The derived part of one (signature, key)'s keyed state: a running window per window
 * length of the signature, and per rule the eventTime of its last notified alert (the
 * cooldown, SPEC §3; Long.MIN_VALUE: none yet).
 */
public class KeyState {
    public RunningWindow[] windows;
    public long[] lastNotified;

    public KeyState() {}
}
