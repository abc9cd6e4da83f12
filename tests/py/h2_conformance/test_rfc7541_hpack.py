"""RFC 7541: HPACK through the guard. A never-indexed field kept so when the
guard re-encodes (§6.2.3), a dynamic table size update at the head of the
guard's own block (§4.2), and blocks that do not decode (§2.3.3, §4.2,
§5.2; RFC 9113 §4.3)."""
import pytest

from h2peer import (
    E, END_HEADERS, END_STREAM, HEADERS, PADDED, S, SETTINGS, Deadline, Guard, hpack_int, pattern,
    raw_frame,
)
from .harness import (
    assert_complete, assert_connection_error, assert_no_connection_error, assert_sane, held,
    is_frame,
)


def test_never_indexed_survives_re_encoding(rig):
    """A field the client sends never-indexed (a secret) reaches the app
    never-indexed, also once the guard re-encodes the client's blocks (it
    dropped a refused request whose block changed the HPACK table)."""
    from hpack import NeverIndexedHeaderTuple
    app = rig.start(guard_args=["--guard-max-streams", "1"],
                    log=Guard.LOG + ",drainshim::guard::relay=debug")
    c = rig.client()
    held = c.get("/hold")
    app.wait(lambda: app.find(path="/hold"), 10, "the held request at the app")
    # Over the stream cap: refused before the app sees it. python-h2 indexes
    # this field, so the app's table no longer follows the client's.
    refused = c.request("GET", "/bytes?n=1", [("x-fresh", "indexed-by-the-client")])
    c.wait(lambda: c.stream(refused).done, 10, "the over-cap request refused")
    assert c.stream(refused).reset == E.REFUSED_STREAM, repr(c.stream(refused))
    c.reset_stream(held)
    app.wait(lambda: all(r.reset is not None for r in app.find(path="/hold")), 10,
             "the held request reset at the app")
    d = Deadline(15)
    for _ in range(30):   # the guard may see the reset a moment after the app
        s = c.request("GET", "/bytes?n=100&seed=3",
                      [NeverIndexedHeaderTuple("authorization", "Bearer s3cret"),
                       ("x-fresh", "indexed-by-the-client")])
        c.wait_done([s], d.remaining(), "the request with a secret")
        if c.stream(s).reset != E.REFUSED_STREAM or d.expired():
            break
    assert_complete(c.stream(s), pattern(100, 3), "the request with a secret")
    [req] = [r for r in app.find(path="/bytes?n=100&seed=3")]
    fields = {(bytes(n) if isinstance(n, (bytes, bytearray)) else n.encode()): h
              for h in req.headers for n in [h[0]]}
    auth = fields.get(b"authorization")
    assert auth is not None and isinstance(auth, NeverIndexedHeaderTuple), (
        f"authorization must arrive never-indexed: {req.headers}")
    fresh = fields.get(b"x-fresh")
    assert fresh is not None and not isinstance(fresh, NeverIndexedHeaderTuple)
    assert "re-encoding the client's blocks" in rig.guard.log(), (
        "the case must go through the guard's re-encoding:\n" + rig.guard.log(30))
    assert_sane(rig)


def test_own_block_after_a_lowered_table_size_starts_with_the_update(rig):
    """The client lowers HEADER_TABLE_SIZE; once the app acked it, the next
    header block the client gets must start with a dynamic table size update
    (RFC 7541 §4.2; Envoy's HPACK decoder enforces it). When that block is
    the guard's own (here its 431 for a header list over its limit), the
    guard must put the update in."""
    app = rig.start()
    c = rig.client()
    c.conn.update_settings({S.HEADER_TABLE_SIZE: 256})
    c.flush()
    acks_before = len([f for f in c.frames(SETTINGS) if f.ack])
    c.wait(lambda: len([f for f in c.frames(SETTINGS) if f.ack]) > acks_before, 10,
           "the app's ack of the lowered table size")
    big = c.request("GET", "/bytes?n=1", [(f"x-big-{i}", "v" * 4000) for i in range(20)])
    c.wait_done([big], 10, "the request over the header list limit")
    st = c.stream(big)
    assert st.status() == "431", f"the guard answers 431 itself: {st!r}"
    assert not app.find(path="/bytes?n=1"), "the app never saw the refused request"
    [first] = [f for f in c.frames(HEADERS) if f.stream == big][:1]
    block = first.payload
    if first.flags & PADDED:
        block = block[1:len(block) - block[0]]
    assert block and block[0] & 0xE0 == 0x20, (
        f"the block does not start with a dynamic table size update: {bytes(block[:8]).hex()}")
    size = block[0] & 0x1F
    assert size <= 256, f"the update names {size}, above the client's 256"
    # And the app's next block still decodes.
    ok = c.get("/bytes?n=10&seed=1")
    c.wait_done([ok], 10, "a request after the 431")
    assert_complete(c.stream(ok), pattern(10, 1), "the request after the 431")
    assert_sane(rig)
    assert_no_connection_error(c)


@pytest.mark.parametrize("block", [
    b"\x82\x86\x84" + hpack_int(70, 7, 0x80),
    b"\x82\x86\x84" + hpack_int(62, 4) + b"\x01a",
    hpack_int(8192, 5, 0x20) + b"\x82\x86\x84",
    b"\x82" + hpack_int(0, 5, 0x20) + b"\x86\x84",
    b"\x82\x86\x84\x41\x84\xff\xff\xff\xff",
], ids=["index-past-the-tables", "name-index-past-the-tables", "size-update-above-the-setting",
        "size-update-after-a-field", "huffman-eos"])
def test_a_header_block_that_does_not_decode(rig, block):
    """RFC 7541 §2.3.3 (an index past both tables), §4.2 and §6.3 (a table
    size update above SETTINGS_HEADER_TABLE_SIZE, or after the block's first
    field), §5.2 (EOS in a Huffman string): decoding errors, which RFC 9113
    §4.3 makes a connection error COMPRESSION_ERROR. The guard decodes every
    client block (to follow the table), so it fails first; the app never
    sees the block."""
    rig.start()
    c = rig.raw()
    c.send(raw_frame(HEADERS, END_HEADERS | END_STREAM, 1, block))
    assert_connection_error(rig, c, E.COMPRESSION_ERROR, is_frame(HEADERS, 1),
                            "an undecodable header block")
