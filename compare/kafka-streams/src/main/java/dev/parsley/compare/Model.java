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

    /** A customer, keyed by the customer id. */
    record Customer(String name, String city) {}

    /** An order to deliver: with its customer's name and city, and the city's region. */
    record Delivery(String customer, String name, String city, String region, long amount_cents) {
        /** {@code order} to deliver to {@code customer}, its region not known yet. */
        static Delivery of(Order order, Customer customer) {
            return new Delivery(order.customer(), customer.name(), customer.city(), "",
                    order.amount_cents());
        }

        /** The delivery with its city's region. */
        Delivery inRegion(String region) {
            return new Delivery(customer, name, city, region, amount_cents);
        }
    }
}
