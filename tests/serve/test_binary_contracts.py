"""The reward server's request bodies without a server: the binary body (``rewardkit.serve.binary``: its layout,
every refusal with its status and message, which bodies are light enough for the event loop) and the JSON wire
(``rewardkit.serve.wire``: images, prompts, sources, metadata, pixel counts). Expected bytes and values are
written out by hand (little-endian patterns from ``struct``, not from the module). These are the tests
``scripts/mutation.sh binary`` runs."""

from __future__ import annotations

import base64
import io
import json
import struct
import warnings
import zlib

import numpy as np
import pytest
import torch
from PIL import Image

from rewardkit import media
from rewardkit.serve import wire
from rewardkit.serve.binary import (CONTENT_TYPE, LIGHT_HEADER_BYTES, MAGIC, BinaryImage, light_header,
                                    only_raw_pixels, pack_body, parse_body)
from rewardkit.serve.checks import HTTPError


def frame(header: bytes, payload: bytes = b"", n: int | None = None) -> bytes:
    return b"RKB1" + (len(header) if n is None else n).to_bytes(4, "little") + header + payload


def refused(status: int, message: str, fn, *args, **kw) -> None:
    with pytest.raises(HTTPError) as e:
        fn(*args, **kw)
    assert (e.value.status, e.value.message) == (status, message)
    assert str(e.value) == message


@pytest.fixture
def max_pixels():
    """Set rewardkit.media's per-image pixel limit for one test (restored after)."""
    yield media.set_max_pixels
    media.set_max_pixels(None)


# ------------------------------------------------------------------------------------------------ binary body

def test_constants():
    assert MAGIC == b"RKB1" and CONTENT_TYPE == "application/octet-stream" and LIGHT_HEADER_BYTES == 65536


def test_pack_body_layout_by_hand():
    body = pack_body({"prompt": "a"}, {"images": [({"encoded": 3}, b"abc"), ({"shape": [1, 2]}, b"\x01\x02")]})
    head = b'{"prompt":"a","images":[{"encoded":3},{"shape":[1,2]}]}'
    assert body == b"RKB1" + bytes([len(head), 0, 0, 0]) + head + b"abc\x01\x02"
    # images_a before images_b whatever the order given, then the sources sample by sample
    body = pack_body({}, {"images_b": [({"encoded": 1}, b"B")], "images_a": [({"encoded": 1}, b"A")]},
                     sources=[[({"encoded": 2}, b"s0")], [], [({"encoded": 1}, b"t"), ({"encoded": 1}, b"u")]])
    head = (b'{"images_a":[{"encoded":1}],"images_b":[{"encoded":1}],"sources":[[{"encoded":2}],[],'
            b'[{"encoded":1},{"encoded":1}]]}')
    assert body == b"RKB1" + bytes([len(head), 0, 0, 0]) + head + b"ABs0tu"
    assert pack_body({"prompt": "é"}, {}) == frame(b'{"prompt":"\\u00e9"}')
    with pytest.raises(ValueError):
        pack_body({"metadata": [{"x": float("nan")}]}, {})  # JSON has no NaN: refused, not written


def test_parse_body_reads_images_in_place_in_their_order():
    px = bytes(range(12))
    # a source entry that is not a list is left for wire.sources to refuse (pack_body cannot write one)
    head = {"prompt": ["p", "q"], "metadata": [None, {"k": 1}],
            "images": [{"shape": [2, 2, 3], "dtype": "uint8"}, {"encoded": 4}],
            "sources": [[{"shape": [1, 1]}], "not a list"]}
    raw = frame(json.dumps(head).encode(), px + b"\x89PNG" + b"\x07")
    body = parse_body(raw, "score")
    assert body["prompt"] == ["p", "q"] and body["metadata"] == [None, {"k": 1}]
    a, b = body["images"]
    assert isinstance(a, BinaryImage) and a.desc == {"shape": [2, 2, 3], "dtype": "uint8"} and bytes(a.data) == px
    assert b.desc == {"encoded": 4} and bytes(b.data) == b"\x89PNG"
    assert isinstance(a.data, memoryview) and a.data.obj is raw  # a view of the body, not a copy
    assert bytes(body["sources"][0][0].data) == b"\x07" and body["sources"][1] == "not a list"
    with pytest.raises(AttributeError):
        a.other = 1  # two slots only
    # compare bodies: images_a then images_b; an "images" field there is not an image list
    raw = pack_body({}, {"images_a": [({"encoded": 1}, b"A")], "images_b": [({"encoded": 2}, b"BB")]})
    body = parse_body(raw, "compare")
    assert bytes(body["images_a"][0].data) == b"A" and bytes(body["images_b"][0].data) == b"BB"
    refused(400, "the binary body has 3 bytes after its last image", parse_body, raw, "score")
    raw = frame(b'{"images":{"not":"a list"},"images_a":"x"}')
    assert parse_body(raw, "compare") == {"images": {"not": "a list"}, "images_a": "x"}
    assert parse_body(frame(b"{}"), "score") == {}  # the header ends the body exactly


def test_parse_body_refusals_with_status_and_message():
    magic = "a binary body starts with b'RKB1' and the header's length (see rewardkit.serve.binary)"
    refused(400, magic, parse_body, b"RKB1\x02\x00\x00", "score")  # 7 bytes
    refused(400, magic, parse_body, b"RKB2" + frame(b"{}")[4:], "score")
    # 8 bytes: the fixed part is there, the (empty) header is not JSON
    with pytest.raises(HTTPError) as e:
        parse_body(frame(b""), "score")
    assert e.value.status == 400 and e.value.message.startswith("the binary body's header is not valid JSON: ")
    refused(400, "the binary header claims 1,000,000 bytes; the body has 2 after the length", parse_body,
            frame(b"{}", n=10 ** 6), "score")
    refused(400, "the binary header claims 3 bytes; the body has 2 after the length", parse_body,
            frame(b"{}", n=3), "score")
    refused(400, "the binary body's header must be a JSON object", parse_body, frame(b"[1, 2]"), "score")
    big = json.dumps({"prompt": "x" * 1200}).encode()  # 1,214 bytes of header
    refused(413, "the binary body's header has 1,214 bytes of JSON, over this server's limit of 1,213", parse_body,
            frame(big), "score", max_json_bytes=1213)
    assert parse_body(frame(big), "score", max_json_bytes=1214)["prompt"] == "x" * 1200
    many = b'{"m":[' + b",".join([b"1"] * 1200) + b"]}"  # 1,199 ',' + 1 '[' + 1 '{'
    refused(413, "the binary body's header has 1,201 ',' '[' '{' characters, over this server's limit of 1,200 "
                 "JSON values per request", parse_body, frame(many), "score", max_json_items=1200)
    assert len(parse_body(frame(many), "score", max_json_items=1201)["m"]) == 1200
    # the payload: an image past its end, bytes after the last one
    head = b'{"images":[{"encoded":1},{"shape":[20,20,3]}]}'
    refused(400, "images[1]: the payload ends before this image's 1,200 bytes", parse_body,
            frame(head, b"x" + bytes(1199)), "score")
    refused(400, "the binary body has 1,500 bytes after its last image", parse_body,
            frame(head, b"x" + bytes(1200 + 1500)), "score")
    assert len(parse_body(frame(head, b"x" + bytes(1200)), "score")["images"]) == 2
    refused(400, "sources[1][0]: 'encoded' must be the file's positive byte count, alone", parse_body,
            frame(b'{"sources":[[{"encoded":1}],[{"encoded":0}]]}', b"x"), "score")


def test_image_descriptors_are_checked_before_any_byte_is_read(max_pixels):
    def parse(*descs, payload=b""):
        return parse_body(frame(json.dumps({"images": list(descs)}).encode(), payload), "score")

    refused(400, "images[0]: an image descriptor is {'shape', 'dtype'} or {'encoded': N}, got str", parse, "AAAA")
    alone = "images[0]: 'encoded' must be the file's positive byte count, alone"
    for bad in ({"encoded": 0}, {"encoded": -1}, {"encoded": True}, {"encoded": 1.0}, {"encoded": "1"},
                {"encoded": 1, "dtype": "uint8"}):
        refused(400, alone, parse, bad, payload=b"x")
    refused(400, "images[0]: unknown keys ['data', 'z'] (expected shape, dtype or encoded)", parse,
            {"shape": [1, 1], "z": 0, "data": ""})
    # bytes each descriptor takes: H x W (x C) x the item size; uint8 without a dtype
    for desc, n in (({"shape": [2, 3]}, 6), ({"shape": [2, 3, 4], "dtype": "uint8"}, 24),
                    ({"shape": [3, 2, 2], "dtype": "float32"}, 48), ({"shape": [3, 2, 2], "dtype": "float16"}, 24),
                    ({"shape": [3, 2, 2], "dtype": "bfloat16"}, 24), ({"encoded": 5}, 5)):
        assert len(parse(desc, payload=bytes(n))["images"][0].data) == n
        refused(400, "the binary body has 1 bytes after its last image", parse, desc, payload=bytes(n + 1))
    refused(400, "images[0]: dtype must be one of ['bfloat16', 'float16', 'float32', 'uint8'], got 'int64'", parse,
            {"shape": [1, 1], "dtype": "int64"})
    max_pixels(100)
    refused(413, "images[0]: 11x10 pixels is over the limit of 100", parse, {"shape": [10, 11]})
    assert parse({"shape": [10, 10]}, payload=bytes(100))["images"][0].desc == {"shape": [10, 10]}


def test_light_header_reads_the_announced_length_only():
    assert light_header(b"RKB1\x00\x00\x01")  # 7 bytes: malformed, its 400 is cheap
    assert light_header(b"RKB2" + struct.pack("<I", 10 ** 6))  # not this format: malformed
    assert light_header(b"RKB1" + struct.pack("<I", 65536))
    assert not light_header(b"RKB1" + struct.pack("<I", 65537))
    assert not light_header(b"RKB1" + struct.pack("<I", 10 ** 6))  # 8 bytes: the length alone decides
    # the length is unsigned: 2**31 and more are long headers, not negative (short) ones
    assert not light_header(b"RKB1" + bytes([0, 0, 0, 0x80])) and not light_header(b"RKB1" + b"\xff" * 4)
    assert light_header(b"RKB1" + struct.pack("<I", 4) + b"{}{}")


def test_only_raw_pixels_per_field():
    def im(**desc):
        return BinaryImage(desc, memoryview(b""))

    raw, raw8, flt, enc = im(shape=[1, 1]), im(shape=[1, 1], dtype="uint8"), im(shape=[3, 1, 1], dtype="float16"), \
        im(encoded=1)
    assert only_raw_pixels({}) and only_raw_pixels({"images": [raw, raw8], "prompt": "a"})
    assert not only_raw_pixels({"images": [raw, flt]})
    assert not only_raw_pixels({"images": [enc]})
    assert not only_raw_pixels({"images": [raw, {"shape": [1, 1]}]})  # not parsed: not known to be raw
    assert not only_raw_pixels({"images_a": [raw], "images_b": [enc]})
    assert not only_raw_pixels({"images_a": [flt], "images_b": [raw]})
    assert only_raw_pixels({"images": "not a list", "images_b": None})
    assert only_raw_pixels({"images": [raw], "sources": [[raw8], "skip", [raw, raw]]})
    assert not only_raw_pixels({"images": [raw], "sources": [[raw], [raw, enc]]})
    assert not only_raw_pixels({"images": [flt], "sources": [[raw]]})
    assert only_raw_pixels({"images": [raw], "sources": {"not": "a list"}})


# -------------------------------------------------------------------------------------------------- JSON wire

def png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (1, 2, 3)).save(buf, "PNG")
    return buf.getvalue()


def png_header(w: int, h: int) -> bytes:
    """A PNG signature, an IHDR claiming w x h (8-bit RGB) and an empty IDAT: PIL opens it from the header."""
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return b"\x89PNG\r\n\x1a\n" + chunk + struct.pack(">I", 0) + b"IDAT" + struct.pack(">I", zlib.crc32(b"IDAT"))


def b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def test_decode_image_forms_and_refusals():
    # an encoded file, base64 or binary: its bytes
    assert wire.decode_image(b64(b"\x89PNG file"), "images[0]") == b"\x89PNG file"
    got = wire.decode_image(BinaryImage({"encoded": 3}, memoryview(b"abc")), "x")
    assert got == b"abc" and type(got) is bytes
    refused(400, "images[2]: not valid base64", wire.decode_image, "QU JD", "images[2]")
    refused(400, "images[2]: not valid base64", wire.decode_image, "QUJ", "images[2]")
    refused(400, "images[0]: an image is a base64 string or {'data', 'shape', 'dtype'}, got int", wire.decode_image,
            5, "images[0]")
    refused(400, "images[0]: unknown keys ['encoded', 'x'] (expected data, shape, dtype)", wire.decode_image,
            {"data": "", "shape": [1, 1], "x": 1, "encoded": 2}, "images[0]")
    # raw pixels: uint8 by default, from base64 or from the binary body
    px = bytes(range(6))
    want = np.array([[[0], [1], [2]], [[3], [4], [5]]], np.uint8)
    for obj in ({"data": b64(px), "shape": [2, 3, 1]}, BinaryImage({"shape": [2, 3, 1]}, memoryview(px))):
        a = wire.decode_image(obj, "images[0]")
        assert a.dtype == np.uint8 and np.array_equal(a, want)
    refused(400, "images[1]: 5 bytes do not match shape [2, 3] and dtype uint8 (6 bytes)", wire.decode_image,
            {"data": b64(px[:5]), "shape": [2, 3]}, "images[1]")
    refused(400, "images[1]: 'data' must be a base64 string", wire.decode_image, {"data": 5, "shape": [2, 3]},
            "images[1]")
    refused(400, "images[1]: 'data' is not valid base64", wire.decode_image, {"data": "AA AA", "shape": [1, 3]},
            "images[1]")
    refused(400, "images[1]: a float32 image has shape [3, H, W]; got [2, 3]", wire.decode_image,
            {"data": b64(px), "shape": [2, 3], "dtype": "float32"}, "images[1]")
    # a float image: little-endian on the wire, the values exactly
    vals = [0.0, 0.25, 0.5, 1.0, 0.125, 0.75]
    f32 = struct.pack("<6f", *vals)
    for obj in ({"data": b64(f32), "shape": [3, 1, 2], "dtype": "float32"},
                BinaryImage({"shape": [3, 1, 2], "dtype": "float32"}, memoryview(f32))):
        t = wire.decode_image(obj, "images[0]")
        assert t.dtype == torch.float32 and t.shape == (3, 1, 2) and t.flatten().tolist() == vals


def test_from_raw_float_dtypes_bit_patterns():
    vals = [0.0, 0.25, 0.5, 1.0, 0.125, 0.75]
    t = wire.from_raw(struct.pack("<6e", *vals), [3, 2, 1], "float16")
    assert t.dtype == torch.float16 and t.shape == (3, 2, 1) and t.flatten().tolist() == vals
    t[0, 0, 0] = 2.0  # a copy in native order: writable, owned
    # bfloat16: the top 16 bits of the float32 pattern (1.0 = 0x3F80, 0.5 = 0x3F00, 2.0 = 0x4000, -1.0 = 0xBF80)
    bf = struct.pack("<6H", 0x3F80, 0x3F00, 0x4000, 0xBF80, 0x0000, 0x3E80)
    t = wire.from_raw(memoryview(bf), [3, 1, 2], "bfloat16")
    assert t.dtype == torch.bfloat16 and t.flatten().tolist() == [1.0, 0.5, 2.0, -1.0, 0.0, 0.25]
    t = wire.from_raw(struct.pack("<3f", 0.5, 1.0, 0.25), [3, 1, 1], "float32")
    assert t.dtype == torch.float32 and t.flatten().tolist() == [0.5, 1.0, 0.25]
    a = wire.from_raw(b"\x01\x02\x03\x04", [2, 2], "uint8")
    assert a.tolist() == [[1, 2], [3, 4]] and not a.flags.writeable  # read in place


def test_pixel_count_reads_headers_and_shapes(max_pixels):
    assert wire.pixel_count(png(5, 7)) == 35 and wire.pixel_count(bytearray(png(5, 7))) == 35
    assert wire.pixel_count(b"\x89PNG\r\n\x1a\n corrupt") == 0
    max_pixels(35)
    assert wire.pixel_count(png(5, 7)) == 35
    max_pixels(34)
    assert wire.pixel_count(png(5, 7)) == 0  # over the per-image limit: refused per sample later
    max_pixels(None)
    # a header PIL warns about (a decompression bomb below twice its limit) is still counted, warnings as errors
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert wire.pixel_count(png_header(10_000, 10_000)) == 100_000_000
    assert wire.pixel_count(np.zeros((4, 6, 3), np.uint8)) == 24 and wire.pixel_count(np.zeros((4, 6), np.uint8)) == 24
    assert wire.pixel_count(torch.zeros(3, 4, 5)) == 20
    assert wire.pixel_count(torch.zeros(4, 5)) == 0 and wire.pixel_count(object()) == 0


def test_is_float_image():
    assert not wire.is_float_image(b"x") and not wire.is_float_image(bytearray(b"x"))
    assert not wire.is_float_image(np.zeros((1, 1), np.uint8)) and wire.is_float_image(torch.zeros(3, 1, 1))


def test_image_list_bounds():
    body = {"images": [b64(b"a"), b64(b"b")], "empty": [], "text": "x"}
    assert wire.image_list(body, "images", 2) == [b"a", b"b"]
    refused(413, "'images' has 2 images; this server takes at most 1 per request", wire.image_list, body, "images", 1)
    for key in ("empty", "text", "missing"):
        refused(400, f"'{key}' must be a non-empty list of images", wire.image_list, body, key, 5)
    assert wire.image_list(body, "empty", 5, required=False) == []
    refused(400, "'text' must be a non-empty list of images", wire.image_list, body, "text", 5, required=False)
    refused(400, "images[1]: not valid base64", wire.image_list, {"images": [b64(b"a"), "!"]}, "images", 5)


def test_prompts():
    assert wire.prompts({}, 2, uses_prompt=False) == [None, None]
    assert wire.prompts({"prompt": "p"}, 3, uses_prompt=False) == ["p", "p", "p"]
    given = ["a", "b"]
    got = wire.prompts({"prompt": given}, 2, uses_prompt=True)
    assert got == ["a", "b"] and got is not given
    refused(400, "got 2 images but 3 prompts (send one string to broadcast)", wire.prompts, {"prompt": ["a"] * 3}, 2,
            True)
    for bad in ({}, {"prompt": 5}, {"prompt": ["a", 5]}):
        refused(400, "'prompt' must be a string or a list of strings", wire.prompts, bad, 2, True)


def test_sources():
    assert wire.sources({}, 2, 10) is None
    body = {"sources": [[b64(b"a")], [b64(b"b"), b64(b"c")]]}
    assert wire.sources(body, 2, 3) == [[b"a"], [b"b", b"c"]]
    refused(413, "'sources' has 3 source images; this server takes at most 2 per request (send fewer samples per "
                 "request)", wire.sources, body, 2, 2)
    for bad, n in (({"sources": "x"}, 2), (body, 3)):
        refused(400, f"'sources' must be a list with one list of images per sample ({n})", wire.sources, bad, n, 9)
    refused(400, "sources[1] must be a list of images", wire.sources, {"sources": [[], "x"]}, 2, 9)
    refused(400, "sources[1][0]: not valid base64", wire.sources, {"sources": [[], ["!"]]}, 2, 9)


def test_metadata():
    assert wire.metadata({}, 2) is None
    assert wire.metadata({"metadata": [None, {"k": 1}]}, 2) == [{}, {"k": 1}]
    for bad in ("x", [{}], [{}, 5], [{}, {}, {}]):
        refused(400, "'metadata' must be a list of 2 objects (or null entries)", wire.metadata, {"metadata": bad}, 2)
