"""Host-side framing: encode/decode, resynchronisation, and agreement with the C codec."""
import random
import shutil
import subprocess
import zlib

import pytest
from hypothesis import given, settings, strategies as st

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
    info = P.Info.unpack(struct.pack("<8I4B", 112, 640, 10, 2, 25_000_000, 25_000_000, 8192,
                                     0x20000000, 2, 1, 1, 0) + b"mps2-an386\0cortex-m4\0abc\0")
    assert (info.timer, info.board, info.core, info.build_id) == ("systick", "mps2-an386", "cortex-m4", "abc")
    r = P.InvokeResult.unpack(struct.pack("<iQIBB", 0, 1000, 25_000_000, 2, 3))
    assert (r.ticks, r.timer, r.marks) == (1000, "systick", 3) and r.seconds == pytest.approx(4e-5)
