"""The reward server's binary request body: the JSON request with every image's bytes moved out of the JSON.

``Content-Type: application/octet-stream``::

    b"RKB1"                      4 bytes, the format and its version
    header length                uint32, little-endian
    header                       UTF-8 JSON: the JSON request (``images`` / ``images_a`` / ``images_b``,
                                 ``prompt``, ``sources``, ``metadata``) with each image replaced by a descriptor
    payload                      the images' bytes, back to back, in the order of their descriptors

A descriptor is ``{"shape": [H, W] | [H, W, C], "dtype": "uint8"}`` (raw pixels), ``{"shape": [3, H, W],
"dtype": "float32" | "float16" | "bfloat16"}`` (a float image, little-endian) or ``{"encoded": N}`` (an
encoded file of N bytes: PNG, JPEG, ...). The descriptors are read in a fixed order: ``images`` (or
``images_a`` then ``images_b``), then ``sources`` sample by sample; each takes the next ``N`` bytes of the
payload (raw pixels: the product of the shape times the item size), and the payload must end with the last
one. Nothing is base64-encoded, and raw pixels are read in place from the request body.

The same checks as the JSON body apply, from the header, before any pixel is read: shapes and dtypes, the
per-image pixel limit (413), then the server's per-request limits on images and decoded pixels. The header is
JSON and bounded as a JSON body is (``max_json_bytes``, ``max_json_items``: 413 before it is parsed). A body that
does not follow this layout is a 400.
"""

from __future__ import annotations

import json
import struct
from typing import Any

from .checks import HTTPError, check_raw, loads_json

__all__ = ["MAGIC", "CONTENT_TYPE", "BinaryImage", "parse_body", "pack_body", "light_header", "only_raw_pixels"]

MAGIC = b"RKB1"
CONTENT_TYPE = "application/octet-stream"
_IMAGE_FIELDS = ("images", "images_a", "images_b")


class BinaryImage:
    """One image of a binary body: its descriptor and its bytes (a view of the request body, not a copy).
    :func:`rewardkit.serve.wire.decode_image` turns it into what the JSON form gives."""

    __slots__ = ("desc", "data")

    def __init__(self, desc: dict, data: memoryview):
        self.desc, self.data = desc, data


def _nbytes(desc: Any, where: str) -> int:
    """Bytes a descriptor takes in the payload, after checking it as the JSON form is checked (pixel limit
    included: nothing is read for an image over it)."""
    if not isinstance(desc, dict):
        raise HTTPError(400, f"{where}: an image descriptor is {{'shape', 'dtype'}} or {{'encoded': N}}, "
                             f"got {type(desc).__name__}")
    if "encoded" in desc:
        n = desc["encoded"]
        if set(desc) != {"encoded"} or not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise HTTPError(400, f"{where}: 'encoded' must be the file's positive byte count, alone")
        return n
    unknown = set(desc) - {"shape", "dtype"}
    if unknown:
        raise HTTPError(400, f"{where}: unknown keys {sorted(unknown)} (expected shape, dtype or encoded)")
    return check_raw(desc.get("shape"), desc.get("dtype", "uint8"), where)


#: a binary body whose header is at most this long and whose images are all raw uint8 pixels is parsed on the
#: server's event loop (its pixels are neither read nor copied: less work than a hop to a thread); any other
#: body in a thread
LIGHT_HEADER_BYTES = 64 * 1024


def light_header(raw: bytes) -> bool:
    """Whether ``raw``'s header is short enough to parse on the event loop (a malformed start: True, its 400
    comes from the first bytes)."""
    return len(raw) < 8 or raw[:4] != MAGIC or struct.unpack_from("<I", raw, 4)[0] <= LIGHT_HEADER_BYTES


def only_raw_pixels(body: dict[str, Any]) -> bool:
    """Whether every image of a parsed binary body is raw uint8 pixels (read in place: nothing to decode, copy
    or open), so that checking the request costs no more than its header."""
    def raw_uint8(x: Any) -> bool:
        return isinstance(x, BinaryImage) and "encoded" not in x.desc and x.desc.get("dtype", "uint8") == "uint8"

    for key in _IMAGE_FIELDS:
        value = body.get(key)
        if isinstance(value, list) and not all(raw_uint8(x) for x in value):
            return False
    srcs = body.get("sources")
    if isinstance(srcs, list):
        return all(raw_uint8(x) for entry in srcs if isinstance(entry, list) for x in entry)
    return True


def parse_body(raw: bytes, kind: str, max_json_bytes: int | None = None,
               max_json_items: int | None = None) -> dict[str, Any]:
    """A binary request body -> the JSON request's object, with each image a :class:`BinaryImage`.

    Raises :class:`HTTPError` 400 for a body that does not follow the layout (and 413 for an image over the
    pixel limit, or a header over ``max_json_bytes`` / ``max_json_items``: see
    :func:`rewardkit.serve.checks.loads_json`), before any image is decoded."""
    if len(raw) < 8 or raw[:4] != MAGIC:
        raise HTTPError(400, "a binary body starts with b'RKB1' and the header's length "
                             "(see rewardkit.serve.binary)")
    (hlen,) = struct.unpack_from("<I", raw, 4)
    if hlen > len(raw) - 8:
        raise HTTPError(400, f"the binary header claims {hlen:,} bytes; the body has {len(raw) - 8:,} after the "
                             "length")
    if max_json_bytes is not None and hlen > max_json_bytes:  # refused before the header is copied or read
        raise HTTPError(413, f"the binary body's header has {hlen:,} bytes of JSON, over this server's limit of "
                             f"{max_json_bytes:,}")
    body = loads_json(bytes(raw[8:8 + hlen]), "the binary body's header", max_json_bytes, max_json_items)
    if not isinstance(body, dict):
        raise HTTPError(400, "the binary body's header must be a JSON object")
    view = memoryview(raw)
    pos = 8 + hlen

    def take(desc: Any, where: str) -> BinaryImage:
        nonlocal pos
        n = _nbytes(desc, where)
        if pos + n > len(raw):
            raise HTTPError(400, f"{where}: the payload ends before this image's {n:,} bytes")
        img = BinaryImage(desc, view[pos:pos + n])
        pos += n
        return img

    fields = ("images",) if kind == "score" else ("images_a", "images_b")
    for key in fields:
        value = body.get(key)
        if isinstance(value, list):
            body[key] = [take(d, f"{key}[{i}]") for i, d in enumerate(value)]
    srcs = body.get("sources")
    if isinstance(srcs, list):
        body["sources"] = [[take(d, f"sources[{i}][{j}]") for j, d in enumerate(entry)]
                           if isinstance(entry, list) else entry for i, entry in enumerate(srcs)]
    if pos != len(raw):
        raise HTTPError(400, f"the binary body has {len(raw) - pos:,} bytes after its last image")
    return body


def pack_body(fields: dict[str, Any], images: dict[str, list[tuple[dict, bytes]]],
              sources: list[list[tuple[dict, bytes]]] | None = None) -> bytes:
    """A binary body: ``fields`` (prompt, metadata, ...), ``images`` (``{"images": [(descriptor, bytes), ...]}``
    or ``images_a`` / ``images_b``) and ``sources`` (per sample, a list of ``(descriptor, bytes)``)."""
    header = dict(fields)
    parts: list[bytes] = []
    for key in _IMAGE_FIELDS:
        if key in images:
            header[key] = [d for d, _ in images[key]]
            parts.extend(b for _, b in images[key])
    if sources is not None:
        header["sources"] = [[d for d, _ in entry] for entry in sources]
        parts.extend(b for entry in sources for _, b in entry)
    head = json.dumps(header, allow_nan=False, separators=(",", ":")).encode()
    return b"".join([MAGIC, struct.pack("<I", len(head)), head, *parts])
