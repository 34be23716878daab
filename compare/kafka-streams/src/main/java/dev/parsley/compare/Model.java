package dev.parsley.compare;

/**
 * The shop's records, as the Rust example {@code shop} writes them in JSON (its
 * {@code src/model.rs}): the field names are the JSON names.
 */
final class Model {
    private Model() {}

    /** An order, keyed by its order id. */
    record Order(String customer, long amount_cents) {}

    /** A payment of an order, keyed by the order id. */
    record Payment(String order, long amount_cents) {}

    /** A payment joined with its order. */
    record Settlement(String order, String customer, long amount_cents) {}
}
