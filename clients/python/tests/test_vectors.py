"""The stamp codec against the repository's test vectors (``spec/stamp-vectors.json``): every
``encode`` case byte for byte and back, every ``decode`` case, and every ``malformed`` case
rejected with its kind, position and value."""

import json
import pathlib
import unittest
import uuid

from parsley_stamp import codec
from parsley_stamp.codec import Channel, DecodeError, Entry, InFlight, Sender, Stamp

VECTORS = pathlib.Path(__file__).resolve().parents[3] / "spec" / "stamp-vectors.json"


def stamp_of(j) -> Stamp:
    sender = j["sender"]
    return Stamp(
        sender=None if sender is None else Sender(uuid.UUID(sender["id"]), int(sender["seq"])),
        acked_through=None if j["acked_through"] is None else int(j["acked_through"]),
        clock=[
            Entry(Channel(uuid.UUID(e["topic"]), e["partition"]), int(e["offset"]))
            for e in j["clock"]
        ],
        in_flight=[
            InFlight(Channel(uuid.UUID(c["topic"]), c["partition"]), int(c["seq"]))
            for c in j["in_flight"]
        ],
    )


class Vectors(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.vectors = json.loads(VECTORS.read_text())

    def test_the_header_names(self):
        self.assertEqual(self.vectors["header"], codec.STAMP_HEADER)
        self.assertEqual(self.vectors["legacy_headers"], [codec.LEGACY_STAMP_HEADER])
        self.assertTrue(codec.is_stamp_header("ps"))
        self.assertFalse(codec.is_stamp_header("traceparent"))

    def test_encode_cases_are_written_byte_for_byte_and_read_back(self):
        self.assertEqual(len(self.vectors["encode"]), 21)
        for case in self.vectors["encode"]:
            with self.subTest(case["name"]):
                stamp = stamp_of(case["stamp"])
                self.assertEqual(codec.encode(stamp).hex(), case["bytes"])
                self.assertEqual(codec.decode(bytes.fromhex(case["bytes"])), stamp)

    def test_decode_cases_are_read(self):
        for case in self.vectors["decode"]:
            with self.subTest(case["name"]):
                self.assertEqual(
                    codec.decode(bytes.fromhex(case["bytes"])), stamp_of(case["stamp"])
                )

    def test_malformed_cases_are_rejected_with_their_kind_and_position(self):
        self.assertEqual(len(self.vectors["malformed"]), 43)
        for case in self.vectors["malformed"]:
            with self.subTest(case["name"]):
                with self.assertRaises(DecodeError) as caught:
                    codec.decode(bytes.fromhex(case["bytes"]))
                got = caught.exception
                want = case["error"]
                self.assertEqual((got.kind, got.at), (want["kind"], want["at"]))
                self.assertEqual(got.value, want.get("value"))

    def test_arbitrary_bytes_give_a_stamp_or_a_decode_error_never_another_exception(self):
        import random

        rng = random.Random(7)
        seeds = [bytes.fromhex(c["bytes"]) for c in self.vectors["encode"]]
        for _ in range(20_000):
            data = bytearray(rng.choice(seeds))
            for _ in range(rng.randint(1, 4)):
                if data and rng.random() < 0.7:
                    data[rng.randrange(len(data))] = rng.randrange(256)
                else:
                    data.insert(rng.randint(0, len(data)), rng.randrange(256))
            try:
                stamp = codec.decode(bytes(data))
            except DecodeError:
                continue
            # What decodes as version 2 is canonical: it encodes to the same bytes.
            if data[0] & 0xF0 == 0x20:
                self.assertEqual(codec.encode(stamp), bytes(data))


if __name__ == "__main__":
    unittest.main()
