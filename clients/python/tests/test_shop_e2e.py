"""The shop end to end with the Python payments service (``examples/shop_payments.py``) on the
broker, feeding the ``shop`` example's Parsley pipeline (``shop run``: each payment joined with
its order, summed per customer). The history is replayed: orders and payments are written
first, the payments timestamped a minute before their orders (a service whose clock runs
behind), then the pipeline reads both. Stamped, every payment is joined with its order: the
revenue per customer is exact. The negative control writes the same payments unstamped: the
pipeline then takes a payment by its timestamp, before its order, and its inner join drops it.

Needs ``PARSLEY_BOOTSTRAP`` and ``SHOP_BIN`` (the ``shop`` binary), as ``cargo xtask python``
sets them."""

import json
import os
import pathlib
import subprocess
import sys
import unittest
import uuid
from collections import defaultdict

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "examples"))

import shop_payments  # noqa: E402

from .test_producer import BOOTSTRAP, read_all  # noqa: E402

SHOP = os.environ.get("SHOP_BIN")
ORDERS = 300
CUSTOMERS = 20
SKIP_EVERY = 7
SKEW_MS = 60_000
PARTITIONS = 4


def revenue(stamped: bool):
    """Runs the scenario (module docs); returns the revenue per customer the pipeline wrote
    last, and the revenue the orders and payments make."""
    run = uuid.uuid4().hex[:12]
    orders, payments, output = (f"py-shop-{t}-{run}" for t in ("orders", "payments", "revenue"))
    subprocess.run(
        [SHOP, "produce-orders", "--bootstrap", BOOTSTRAP, "--topic", orders,
         "--partitions", str(PARTITIONS), "--orders", str(ORDERS),
         "--customers", str(CUSTOMERS)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    counts = shop_payments.run(BOOTSTRAP, orders, payments, SKIP_EVERY, SKEW_MS, stamped)
    assert counts["orders"] == ORDERS, counts
    subprocess.run(
        [SHOP, "run", "--bootstrap", BOOTSTRAP, "--application-id", f"py-shop-{run}",
         "--orders", orders, "--payments", payments, "--output", output,
         "--until-caught-up", "--timeout-secs", "300"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    expected = defaultdict(int)
    records, _ = read_all(orders, PARTITIONS)
    for m in records:
        if not shop_payments.unpaid(int(m.key().decode()[2:]), SKIP_EVERY):
            order = json.loads(m.value())
            expected[order["customer"]] += order["amount_cents"]
    got = {}
    records, _ = read_all(output, PARTITIONS)
    for m in records:
        got[m.key().decode()] = json.loads(m.value())
    return got, dict(expected), counts


@unittest.skipUnless(BOOTSTRAP and SHOP, "needs PARSLEY_BOOTSTRAP and SHOP_BIN (cargo xtask python)")
class ShopEndToEnd(unittest.TestCase):
    def test_stamped_payments_are_each_joined_with_their_order_and_unstamped_ones_are_not(self):
        got, expected, counts = revenue(stamped=True)
        self.assertEqual(got, expected)
        self.assertEqual(sum(got.values()), counts["paid_cents"])

        got, expected, counts = revenue(stamped=False)
        joined = sum(got.values())
        print(
            f"\nnegative control (unstamped payments, clock {SKEW_MS} ms behind): "
            f"{joined} of {counts['paid_cents']} cents joined, "
            f"{len(got)} of {len(expected)} customers with revenue",
            file=sys.stderr,
        )
        self.assertLess(joined, counts["paid_cents"], "payments taken before their orders")


if __name__ == "__main__":
    unittest.main()
