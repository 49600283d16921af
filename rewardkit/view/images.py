"""Thumbnails for the report: downscaled with PIL (longest side ``size``), JPEG q85 for photos or PNG where
that is smaller (flat, small images), either embedded as ``data:`` URIs or written to a folder beside the HTML.
"""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Any

__all__ = ["thumbnail_bytes", "thumbnail_data_uri", "ImageStore"]


def thumbnail_bytes(data: bytes | str | Path, size: int = 256) -> tuple[bytes, str]:
    """``(encoded, mime)``: the image (encoded bytes or a path) with its longest side at most ``size`` pixels,
    as JPEG quality 85, or PNG when that is smaller (or the image has transparency)."""
    from PIL import Image

    src = io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else Path(data)
    with Image.open(src) as im:
        im.load()
        alpha = im.mode in ("RGBA", "LA") or (im.mode == "P" and "transparency" in im.info)
        im = im.convert("RGBA" if alpha else "RGB")
        if max(im.size) > size:
            im.thumbnail((size, size), Image.Resampling.LANCZOS)
        png = io.BytesIO()
        im.save(png, format="PNG", optimize=True)
        if alpha:
            return png.getvalue(), "image/png"
        jpg = io.BytesIO()
        im.save(jpg, format="JPEG", quality=85)
    if png.tell() <= jpg.tell():
        return png.getvalue(), "image/png"
    return jpg.getvalue(), "image/jpeg"


def thumbnail_data_uri(data: bytes | str | Path, size: int = 256) -> str:
    """The thumbnail of :func:`thumbnail_bytes` as a ``data:`` URI."""
    enc, mime = thumbnail_bytes(data, size)
    return f"data:{mime};base64," + base64.b64encode(enc).decode("ascii")


class ImageStore:
    """Images of a report, each stored once (keyed by resolved path or content): ``add`` returns a key into
    :meth:`table`, whose entries are ``{"src": thumbnail, "full": enlarged view, "name": file name}`` or
    ``{"missing": reason, "name": ...}`` when the image cannot be read (shown as text, never a broken link).

    ``mode="embed"``: thumbnails are data URIs, and so is the enlarged view of an image larger than its
    thumbnail: the image at up to ``full_size`` pixels on its longest side (the original when it is smaller),
    while the enlarged images embedded so far total at most ``full_budget`` bytes; past the budget (or with
    ``full_size=0``) the enlarged view is the thumbnail shown larger, and the entry says so (``full_note``).
    ``mode="folder"``: thumbnails are written to ``folder`` (relative links from the HTML) and the enlarged
    view links to the original file (relative path) where there is one.
    A file that exists but cannot be decoded is marked ``unreadable`` (a corrupt file is not a missing one).
    """

    def __init__(self, html_dir: Path, *, mode: str = "embed", folder: Path | None = None, size: int = 256,
                 full_size: int = 1024, full_budget: int = 32 * 2**20):
        if mode not in ("embed", "folder"):
            raise ValueError(f"thumbs must be 'embed' or 'folder', got {mode!r}")
        self.html_dir = Path(html_dir).resolve()
        self.mode, self.size = mode, int(size)
        self.folder = Path(folder) if folder is not None else None
        if mode == "folder" and self.folder is None:
            raise ValueError("thumbs='folder' needs a folder")
        self.full_size, self.full_budget = int(full_size), int(full_budget)
        self.full_bytes = 0  # enlarged images embedded so far
        self._keys: dict[Any, str] = {}
        self._table: dict[str, dict[str, Any]] = {}

    def _rel(self, p: Path) -> str:
        """A relative URL for ``p``: every path segment percent-encoded, so a file named ``javascript:x.png``
        or a folder named ``https:`` stays a relative link (never a scheme), and ``?`` / ``#`` / ``%`` in a
        name stay part of the path."""
        from urllib.parse import quote

        return quote(Path(os.path.relpath(p.resolve(), self.html_dir)).as_posix(), safe="/")

    def _put(self, ident: Any, name: str, data: bytes | Path, size: int, original: Path | None) -> str:
        if ident in self._keys:
            return self._keys[ident]
        key = f"i{len(self._table)}"
        self._keys[ident] = key
        try:
            enc, mime = thumbnail_bytes(data, size)
        except Exception as exc:  # noqa: BLE001  unreadable / missing: the page says why
            if isinstance(exc, FileNotFoundError):
                self._table[key] = {"missing": "file not found", "name": name}
            else:  # the file is there but is not an image PIL can decode: say so, not "missing"
                self._table[key] = {"missing": f"{type(exc).__name__}: {exc}", "name": name, "unreadable": True}
            return key
        entry: dict[str, Any] = {"name": name}
        if self.mode == "embed":
            entry["src"] = entry["full"] = f"data:{mime};base64," + base64.b64encode(enc).decode("ascii")
            self._embed_full(entry, data, size)
        else:
            assert self.folder is not None
            self.folder.mkdir(parents=True, exist_ok=True)
            out = self.folder / f"{key}.{'png' if mime == 'image/png' else 'jpg'}"
            out.write_bytes(enc)
            entry["src"] = self._rel(out)
            entry["full"] = self._rel(original) if original is not None else entry["src"]
        self._table[key] = entry
        return key

    def _embed_full(self, entry: dict[str, Any], data: bytes | Path, size: int) -> None:
        """The enlarged view of an image larger than its thumbnail, within the size budget."""
        from PIL import Image

        if self.full_size <= size:
            return
        try:
            with Image.open(io.BytesIO(data) if isinstance(data, (bytes, bytearray)) else Path(data)) as im:
                dims = im.size
        except Exception:  # noqa: BLE001  decoded once already for the thumbnail: nothing more to show
            return
        if max(dims) <= size:
            return  # the thumbnail is the image itself
        full, mime = thumbnail_bytes(data, self.full_size)
        if self.full_bytes + len(full) > self.full_budget:
            entry["full_note"] = (f"the original ({dims[0]}x{dims[1]}) is not embedded: the report's budget for "
                                  f"enlarged images ({self.full_budget / 2**20:g} MB) is spent")
            return
        self.full_bytes += len(full)
        entry["full"] = f"data:{mime};base64," + base64.b64encode(full).decode("ascii")
        entry["full_size"] = list(Image.open(io.BytesIO(full)).size)

    def add_path(self, path: str | Path, *, size: int | None = None) -> str:
        p = Path(path)
        try:
            ident: Any = ("path", str(p.resolve()), size)
        except OSError:
            ident = ("path", str(p), size)
        return self._put(ident, p.name, p, size or self.size, p if p.is_file() else None)

    def add_bytes(self, data: bytes, name: str, *, size: int | None = None) -> str:
        import hashlib

        return self._put(("bytes", hashlib.sha1(data).hexdigest(), size), name, bytes(data), size or self.size, None)

    def add_data_uri(self, uri: str, name: str) -> str:
        """An image already stored as a data URI (bench records' wrong pairs): kept as is."""
        ident = ("uri", hash(uri))
        if ident in self._keys:
            return self._keys[ident]
        key = f"i{len(self._table)}"
        self._keys[ident] = key
        if not (isinstance(uri, str) and uri.startswith(("data:image/png;base64,", "data:image/jpeg;base64,"))):
            self._table[key] = {"missing": "not an embedded PNG/JPEG image", "name": name}
        else:
            self._table[key] = {"src": uri, "full": uri, "name": name}
        return key

    def table(self) -> dict[str, dict[str, Any]]:
        return dict(self._table)
