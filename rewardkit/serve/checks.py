"""What both request bodies of the reward server check before they read anything (the JSON body of
:mod:`rewardkit.serve.wire`, the binary body of :mod:`rewardkit.serve.binary`): :class:`HTTPError`, the bounds
on a JSON text (:func:`loads_json`) and a raw image's shape, dtype and pixel count (:func:`check_raw`).

Both body formats import this module; neither imports the other's checks (the binary body's images reach
:func:`rewardkit.serve.wire.decode_image`, which is the one direction between them).
"""

from __future__ import annotations

import json
import math
from typing import Any

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_ITEMSIZE = {"uint8": 1, "float32": 4, "float16": 2, "bfloat16": 2}


class HTTPError(Exception):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status
        self.message = message


def loads_json(raw: bytes, what: str, max_bytes: int | None = None, max_items: int | None = None) -> Any:
    """``raw`` (``what``: "the body", "the binary body's header") parsed as JSON, after two bounds checked on
    its bytes: at most ``max_bytes`` (413) and at most ``max_items`` ``,`` ``[`` ``{`` characters (413; counted
    inside strings too: an upper bound on the values it holds, each needing one of them). ``json.loads`` holds
    the interpreter for the whole parse, and costs about 0.1 us per value and 10 ns per byte of string: both
    bounds together bound how long one request can stall the server and the memory its parse takes."""
    if max_bytes is not None and len(raw) > max_bytes:
        raise HTTPError(413, f"{what} has {len(raw):,} bytes of JSON, over this server's limit of {max_bytes:,} "
                             "(send the images in the binary body: RemoteReward does by default)")
    if max_items is not None:
        items = raw.count(b",") + raw.count(b"[") + raw.count(b"{")
        if items > max_items:
            raise HTTPError(413, f"{what} has {items:,} ',' '[' '{{' characters, over this server's limit of "
                                 f"{max_items:,} JSON values per request")
    try:
        return json.loads(raw)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, an integer over int_max_str_digits
        raise HTTPError(400, f"{what} is not valid JSON: {exc}") from None
    except RecursionError:
        raise HTTPError(400, f"{what} is not valid JSON: nested too deeply") from None


def check_raw(shape: Any, dtype: Any, where: str) -> int:
    """Check a raw image's ``shape`` and ``dtype`` (400) and its pixel count against :mod:`rewardkit.media`'s
    per-image limit (413), before anything is read; returns its size in bytes."""
    from .. import media

    if dtype not in _ITEMSIZE:
        raise HTTPError(400, f"{where}: dtype must be one of {sorted(_ITEMSIZE)}, got {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0
                                              for s in shape):
        raise HTTPError(400, f"{where}: shape must be a list of positive ints, got {shape!r}")
    if dtype == "uint8":
        if len(shape) not in (2, 3) or (len(shape) == 3 and shape[2] not in (1, 3, 4)):
            raise HTTPError(400, f"{where}: shape must be [H, W] or [H, W, C] with C in 1, 3, 4; got {shape!r}")
        h, w = shape[0], shape[1]
    else:
        if len(shape) != 3 or shape[0] != 3:
            raise HTTPError(400, f"{where}: a {dtype} image has shape [3, H, W]; got {shape!r}")
        h, w = shape[1], shape[2]
    if h * w > media.get_max_pixels():
        raise HTTPError(413, f"{where}: {w}x{h} pixels is over the limit of {media.get_max_pixels():,}")
    return math.prod(shape) * _ITEMSIZE[dtype]
