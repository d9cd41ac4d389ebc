"""Host-side framing: encode/decode, resynchronisation, and agreement with the C codec."""
import re
import shutil
import subprocess
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.boards import protocol as P
from kiln.firmware import FIRMWARE_DIR


def test_layout_of_a_known_frame():
    f = P.encode(P.T.ECHO, 7, b"hi")
    assert f[:2] == b"\xA5\x5A"
    assert f[2:4] == b"\x02\x00" and f[4] == 0x09 and f[5] == 7
    assert f[6] == P.crc8(f[2:6])
    assert f[7:9] == b"hi"
    assert int.from_bytes(f[9:13], "little") == zlib.crc32(f[2:9])


def test_roundtrip_and_too_long():
    d = P.Decoder()
    frames = d.feed(P.encode(P.T.INFO, 1) + P.encode(P.T.ECHO, 2, bytes(range(200))))
    assert [(f.type, f.seq, f.payload) for f in frames] == [(P.T.INFO, 1, b""), (P.T.ECHO, 2, bytes(range(200)))]
    with pytest.raises(ValueError, match="exceeds the protocol maximum"):
        P.encode(P.T.ECHO, 0, bytes(P.MAX_PAYLOAD + 1))


def test_resync_after_garbage_and_corruption():
    good = P.encode(P.T.ECHO, 3, b"payload")
    bad = bytearray(P.encode(P.T.ECHO, 2, b"damaged"))
    bad[9] ^= 0x10                                   # payload bit flip: CRC32 fails
    d = P.Decoder()
    out = d.feed(b"\x00\xA5\xA5\x5A\x13" + bytes(bad) + good)
    assert [f.seq for f in out] == [3]
    assert d.crc_errors == 1 and d.skipped > 0
    assert "a5 5a" in d.recent_hex()


def test_byte_at_a_time():
    data = P.encode(P.T.INFO, 9, b"x" * 40)
    d = P.Decoder()
    got = [f for b in data for f in d.feed(bytes([b]))]
    assert len(got) == 1 and got[0].payload == b"x" * 40


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=30).filter(lambda g: 0xA5 not in g),
                          st.integers(0, 255), st.binary(max_size=300)), max_size=6),
       st.integers(1, 64))
def test_frames_between_sync_free_garbage_are_all_found(parts, chunk):
    stream = b"".join(g + P.encode(P.T.ECHO, s, p) for g, s, p in parts)
    d = P.Decoder()
    got = [f for i in range(0, len(stream), chunk) for f in d.feed(stream[i:i + chunk])]
    assert [(f.seq, f.payload) for f in got] == [(s, p) for _, s, p in parts]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=2000))
def test_random_bytes_never_yield_an_invalid_frame(data):
    for f in P.Decoder().feed(data):
        assert len(f.payload) <= P.MAX_PAYLOAD
        assert P.encode(f.type, f.seq, f.payload) in data


HOST_C = r"""
#include <stdio.h>
#include "kiln_frame.h"
int main(void) {
    unsigned char p[300], out[400];
    for (int i = 0; i < 300; i++) p[i] = (unsigned char)(i * 7 + 3);
    unsigned lens[] = {0, 1, 5, 64, 300};
    for (int k = 0; k < 5; k++) {
        size_t n = kiln_frame_encode(out, (unsigned char)(0x10 + k), (unsigned char)(k * 51), p, lens[k]);
        for (size_t i = 0; i < n; i++) printf("%02x", out[i]);
        printf("\n");
    }
    return 0;
}
"""


def test_c_codec_matches_python(tmp_path):
    if not shutil.which("gcc"):
        pytest.skip("no host gcc")
    src = tmp_path / "t.c"
    src.write_text(HOST_C)
    rt = FIRMWARE_DIR / "runtime"
    subprocess.run(["gcc", "-O1", f"-I{rt}", str(src), str(rt / "kiln_frame.c"), "-o", str(tmp_path / "t")],
                   check=True)
    lines = subprocess.run([str(tmp_path / "t")], capture_output=True, text=True, check=True).stdout.split()
    p = bytes((i * 7 + 3) & 0xFF for i in range(300))
    for k, n in enumerate([0, 1, 5, 64, 300]):
        assert bytes.fromhex(lines[k]) == P.encode(0x10 + k, (k * 51) & 0xFF, p[:n])


def test_payload_layouts():
    import struct
    info = P.Info(112, 700, 610, 2, 25_000_000, 25_000_000, 8192, 0x20000000, "systick", True, P.VERSION,
                  "mps2-an386", "cortex-m4", "abc", (300, 400), (10, 600))
    p = info.pack()
    assert len(p) == P.INFO_FIXED.size + 16 + len(b"mps2-an386\0cortex-m4\0abc\0")
    assert P.Info.unpack(p) == info
    r = P.InvokeResult.unpack(struct.pack("<IiQIBB", 77, 0, 1000, 25_000_000, 2, 3))
    assert (r.invocation, r.ticks, r.timer, r.marks) == (77, 1000, "systick", 3)
    assert r.seconds == pytest.approx(4e-5)
    c = P.ProfileChunk.unpack(struct.pack("<I4H2Q", 9, 4, 2, 7, 7, 10, 20))
    assert (c.invocation, c.first, c.total, c.stamps) == (9, 4, 7, (10, 20))
    assert P.Hello.unpack(struct.pack("<HIHI", P.VERSION, 5, 512, 3)) == P.Hello(P.VERSION, 5, 512, 3)
    assert P.Nak.unpack(struct.pack("<IBB", 1, 6, 3)).name == "SESSION"


@pytest.mark.parametrize("what,payload,message", [
    ("hello", b"\x02\x00\x01", "HELLO reply has 3 bytes, expected 12"),
    ("hello", bytes([2, 0]) + bytes(510), "HELLO reply has 512 bytes, expected 12"),
    ("info", bytes(20), "INFO reply has 20 bytes, expected at least 40"),
    ("info", bytes(36) + b"\x00\x00\x01\x00", "reports 0 inputs and 1 outputs"),
    ("info", bytes(36) + b"\x01\x00\x01\x00" + bytes(4), "INFO reply has 44 bytes, expected at least 48"),
    ("info", bytes(36) + b"\x01\x00\x01\x00" + bytes(8) + b"board", "not NUL-terminated"),
    ("invoke", bytes(10), "INVOKE reply has 10 bytes, expected 22"),
    ("profile", b"\x00" * 12 + bytes(8), "GET_PROFILE reply with 0 stamps has 20 bytes, expected 12"),
    ("profile", bytes(4) + b"\x00\x00\x03\x00\x04\x00\x00\x00" + bytes(8),
     "GET_PROFILE reply with 3 stamps has 20 bytes, expected 36"),
    ("boot", bytes(3), "BOOT frame has 3 bytes, expected 6"),
    ("nak", bytes(2), "NAK frame has 2 bytes, expected 6"),
    ("fault", bytes(47), "FAULT frame has 47 bytes, expected 48"),
])
def test_malformed_payloads_name_the_field(what, payload, message):
    cls = {"hello": P.Hello, "info": P.Info, "invoke": P.InvokeResult, "profile": P.ProfileChunk,
           "boot": P.Boot, "nak": P.Nak, "fault": P.Fault}[what]
    with pytest.raises(P.ProtocolError, match=re.escape(message)):
        cls.unpack(payload)


def test_hello_of_another_version_is_still_readable():
    """HELLO's layout is frozen: a newer board's longer HELLO still yields its version."""
    import struct
    h = P.Hello.unpack(struct.pack("<HIHI", 9, 1, 512, 1) + b"future")
    assert h.version == 9


def test_decoder_knows_a_frame_that_stopped_half_way():
    d = P.Decoder()
    f = P.encode(P.T.ECHO, 1, b"0123456789")
    assert d.feed(f[:-3]) == [] and d.in_frame()
    d.discard()
    assert not d.in_frame() and d.feed(f) and d.skipped == len(f) - 3


EXPIRE_C = r"""
#include <stdio.h>
#include "kiln_frame.h"
int main(void) {
    unsigned char f[64];
    kiln_parser_t p; kiln_frame_t fr;
    size_t n = kiln_frame_encode(f, 0x03, 42, (const unsigned char *)"0123456789", 10);
    kiln_parser_init(&p);
    for (size_t i = 0; i + 1 < n; i++) { kiln_parser_push(&p, f[i]); while (kiln_parser_next(&p, &fr)) {} }
    printf("%u ", kiln_parser_pending(&p));
    int ev = kiln_parser_expire(&p, &fr);
    printf("%d %u %u %u ", ev, fr.type, fr.seq, kiln_parser_pending(&p));
    for (size_t i = 0; i < n; i++) kiln_parser_push(&p, f[i]);   /* the retransmission parses cleanly */
    printf("%d %u\n", (int)kiln_parser_next(&p, &fr), fr.len);
    kiln_parser_push(&p, 0xA5); kiln_parser_push(&p, 0x5A);       /* no header yet: nothing to NAK */
    printf("%d\n", (int)kiln_parser_expire(&p, &fr));
    return 0;
}
"""


def test_c_parser_inter_byte_timeout(tmp_path):
    """kiln_parser_expire drops a frame cut short, reports its header (NAK GAP), and the
    retransmission that follows parses at once."""
    if not shutil.which("gcc"):
        pytest.skip("no host gcc")
    src = tmp_path / "e.c"
    src.write_text(EXPIRE_C)
    rt = FIRMWARE_DIR / "runtime"
    subprocess.run(["gcc", "-O1", f"-I{rt}", str(src), str(rt / "kiln_frame.c"), "-o", str(tmp_path / "e")],
                   check=True)
    out = subprocess.run([str(tmp_path / "e")], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["20", "4", "3", "42", "0", "1", "10", "0"]
