package dev.parsley.stamp;

/**
 * Bytes that are not the canonical encoding of a valid stamp: the kind (the names of the
 * specification's {@code malformed} cases), the byte position where Parsley's own decoder
 * reports the fault and, for {@code unknown_version} and {@code unknown_flags}, the value.
 */
public final class DecodeException extends Exception {
    private static final long serialVersionUID = 1L;

    private final String kind;
    private final int at;
    private final Integer value;

    DecodeException(String kind, int at, Integer value) {
        super("malformed stamp at byte " + at + ": " + kind + (value == null ? "" : " (" + value + ")"));
        this.kind = kind;
        this.at = at;
        this.value = value;
    }

    DecodeException(String kind, int at) {
        this(kind, at, null);
    }

    /** What is wrong, e.g. {@code truncated}. */
    public String kind() {
        return kind;
    }

    /** The byte position of the fault. */
    public int at() {
        return at;
    }

    /** The version or flag bits, for the two kinds that carry one; else {@code null}. */
    public Integer value() {
        return value;
    }
}
