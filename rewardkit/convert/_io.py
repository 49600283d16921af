"""Reading official checkpoints safely and writing converted rewardkit directories.

Pickled checkpoints (``.pt`` / ``.pth``) are read **only** by the converters, in three layers: the pickle
opcodes are scanned first and any global beyond tensors, storages and ordered dicts (:data:`ALLOWED_GLOBALS`)
refuses the file with its name; then ``torch.load(weights_only=True)`` (torch's own allow-list unpickler)
loads it; then the result is checked to hold nothing but tensors in (nested) dicts. The runtime rewards never read pickles: they load the safetensors written here.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any, Callable

import torch

from .._version import __version__

__all__ = ["read_checkpoint", "state_dict_from", "write_converted", "read_manifest", "MANIFEST", "FORMAT",
           "UnsafeCheckpointError"]

MANIFEST = "rewardkit.json"
FORMAT = "rewardkit-converted"
FORMAT_VERSION = 1
_PICKLE_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt")


class UnsafeCheckpointError(ValueError):
    """A pickled checkpoint holds something other than tensors / storages / ordered dicts."""


_STORAGES = ("Float", "Half", "BFloat16", "Double", "Long", "Int", "Short", "Char", "Byte", "Bool")
#: the only globals a weights pickle may name: tensors (and parameters), storages, ordered dicts
ALLOWED_GLOBALS = frozenset({("collections", "OrderedDict"), ("torch._utils", "_rebuild_tensor_v2"),
                             ("torch._utils", "_rebuild_parameter")}
                            | {("torch", f"{t}Storage") for t in _STORAGES})
_STR_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}


def _pickle_globals(stream: Any) -> list[tuple[str, str] | None]:
    """The globals one pickle names, read from its opcodes without executing anything: ``GLOBAL`` and ``INST``
    (protocol 0's "instantiate module.name", which imports the global as ``GLOBAL`` does) by their argument,
    ``STACK_GLOBAL`` by the strings it pops; ``None`` (treated as refused) for a ``STACK_GLOBAL`` whose operands
    cannot be followed statically and for ``EXT1`` / ``EXT2`` / ``EXT4`` (a code looked up in the unpickling
    process's ``copyreg`` extension registry: which global it names is not in the file)."""
    import pickletools

    found: list[tuple[str, str] | None] = []
    memo: dict[int, Any] = {}
    last: list[Any] = []  # values of the most recent pushes we can follow (strings, else None)
    for op, arg, _ in pickletools.genops(stream):
        name = op.name
        if name in ("GLOBAL", "INST"):
            mod, _, attr = str(arg).partition(" ")
            found.append((mod, attr))
            last.append(None)
        elif name == "STACK_GLOBAL":
            pair = (last[-2], last[-1]) if len(last) >= 2 else (None, None)
            found.append(pair if all(isinstance(x, str) for x in pair) else None)
            del last[-2:]
            last.append(None)
        elif name in ("EXT1", "EXT2", "EXT4"):
            found.append(None)
            last.append(None)
        elif name in _STR_OPS:
            last.append(arg)
        elif name == "MEMOIZE":
            memo[len(memo)] = last[-1] if last else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = last[-1] if last else None
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            last.append(memo.get(int(arg)))
        elif name in ("POP", "POP_MARK", "DUP"):
            last.append(None)  # the stack changed shape: stop trusting earlier pushes
            last.append(None)
        elif name == "STOP":
            break
        else:
            last.append(None)
        if len(last) > 64:
            del last[:-8]
    return found


_ZIP_MAGIC = b"PK\x03\x04"
#: the legacy (non-zip) torch format: magic number, protocol version, sys info, the data, the storage keys
_LEGACY_PICKLES = ("magic number", "protocol version", "sys info", "data", "storage keys")


def scan_pickle(path: Path) -> None:
    """Refuse a ``.pt`` / ``.pth`` whose pickle(s) name anything beyond :data:`ALLOWED_GLOBALS` (checked from
    the opcodes before torch's weights-only unpickler runs; both must accept the file).

    The scan reads exactly the bytes ``torch.load`` will unpickle, and fails closed on anything it cannot parse:

    - the format is decided as torch decides it (``torch.serialization._is_zipfile``: the first four bytes are a
      zip local-file header), never by Python's ``zipfile.is_zipfile``, which also accepts a zip *appended* to
      a legacy pickle (a polyglot that would be scanned as its benign zip while torch unpickles the front);
    - a zip with bytes in front of the archive its end record describes (e.g. a second zip appended to the first)
      is refused: Python's ``zipfile`` shifts every offset by that prefix, torch's reader does not, so each would
      read another archive;
    - a zip: every ``.pkl`` member, in any case (torch's reader finds ``data.pkl`` ignoring case); two members
      whose names differ only in case, or are equal, are refused (which one a reader picks is not defined);
    - legacy: the five pickles torch reads in sequence, each of which must parse to its ``STOP``; one that does
      not parse refuses the file (before, the scan stopped silently there); a file that is a tar archive (torch's
      legacy ``.tar`` layout, which ``torch.load`` tries first and whose member pickles the scan never reads) is
      refused."""
    import io
    import zipfile

    def check(names: list, where: str) -> None:
        bad = sorted({"?" if n is None else f"{n[0]}.{n[1]}" for n in names if n not in ALLOWED_GLOBALS})
        if bad:
            raise UnsafeCheckpointError(
                f"{path}: refused to read this pickle: {where} references {', '.join(bad[:5])}; a weights file "
                "may only hold tensors, storages and ordered dicts. rewardkit never unpickles anything else "
                "(convert a weights-only checkpoint, e.g. HPS_v2.1_compressed.pt, not HPS_v2.pt).")

    with open(path, "rb") as f:
        is_zip = f.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC
    if is_zip:
        try:
            with zipfile.ZipFile(path) as zf:
                infos = zf.infolist()
                _check_zip_offsets(zf, infos, path)
                for info in infos:  # every member: torch reads the storages too
                    _check_zip_member(info, path)
                # torch's reader (miniz) finds a member by name ignoring case: "data.PKL" is its "data.pkl"
                names = [i.filename.lower() for i in infos]
                dup = sorted({n for n in names if names.count(n) > 1})
                if dup:
                    raise UnsafeCheckpointError(f"{path}: zip members listed twice (names compared ignoring case, "
                                                f"as torch's reader finds them: {', '.join(dup[:3])}): refused")
                pkls = [i for i in infos if i.filename.lower().endswith(".pkl")]
                if not pkls:
                    raise UnsafeCheckpointError(f"{path}: a zip file without a pickle: not a torch checkpoint")
                for info in pkls:
                    data = zf.read(info)
                    check(_whole_pickle(io.BytesIO(data), f"{path}: {info.filename}", len(data)), info.filename)
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, RuntimeError, NotImplementedError) as exc:
            # (RuntimeError: zipfile's "encrypted, password required"; NotImplementedError: its "compression method
            # not supported"; both checked first by _check_zip_member, caught here too so no zip ends in exit 1)
            raise UnsafeCheckpointError(f"{path}: starts like a zip (torch checkpoint) but is not a readable "
                                        f"zip file ({exc}): refused") from None
        return
    import tarfile

    if tarfile.is_tarfile(path):  # torch tries the legacy .tar layout first: it would unpickle the tar's members
        raise UnsafeCheckpointError(f"{path}: a tar archive (torch's legacy .tar checkpoint layout, whose member "
                                    "pickles are not the bytes scanned here): refused; re-save it with torch.save")
    with open(path, "rb") as f:
        for what in _LEGACY_PICKLES:
            check(_whole_pickle(f, f"{path}: legacy pickle {what!r}"), f"pickle {what!r}")


#: the compression methods Python's zipfile reads (stored, deflate, bzip2, lzma); torch.save stores
_ZIP_METHODS = (0, 8, 12, 14)


def _check_zip_member(info: Any, path: Path) -> None:
    """Refuse a member the scan cannot read as plain bytes: encrypted (general-purpose flag bit 0) or compressed
    with a method zipfile does not know. Before, zipfile's own ``RuntimeError`` / ``NotImplementedError`` ended
    the command as an internal error (exit 1) instead of a refused file (exit 2)."""
    if info.flag_bits & 0x1:
        raise UnsafeCheckpointError(f"{path}: zip member {info.filename!r} is encrypted: a torch checkpoint never is; "
                                    "refused")
    if info.compress_type not in _ZIP_METHODS:
        raise UnsafeCheckpointError(f"{path}: zip member {info.filename!r} uses compression method "
                                    f"{info.compress_type}, which this scan cannot read (torch.save stores members "
                                    "uncompressed); refused")


def _check_zip_offsets(zf: Any, infos: list, path: Path) -> None:
    """Refuse a zip that Python's ``zipfile`` reads at other offsets than torch's reader (miniz) does. Python
    treats bytes before the central directory's recorded offset as a prefix ("concat") and shifts every offset
    by it; miniz takes the recorded offsets as they are. A zip appended to another zip of the same layout is
    then read as the second by this scan and as the first by ``torch.load``. A torch checkpoint has no prefix:
    its first member's local header is at byte 0 and its central directory where its end record says."""
    import zipfile

    concat = None
    try:
        with open(path, "rb") as fh:
            endrec = zipfile._EndRecData(fh)  # the end record zipfile itself used (zip64-aware)
        if endrec:
            concat = zf.start_dir - endrec[zipfile._ECD_OFFSET]
    except (AttributeError, IndexError, TypeError):  # another zipfile implementation: the member offsets decide
        concat = None
    first = min((i.header_offset for i in infos), default=0)
    if (concat is not None and concat != 0) or first != 0:
        raise UnsafeCheckpointError(
            f"{path}: a zip with {concat if concat else first} bytes before the archive its directory describes "
            "(another archive in front?): Python's zipfile and torch's reader would read different members; "
            "refused")


def _whole_pickle(stream: Any, where: str, size: int | None = None) -> list[tuple[str, str] | None]:
    """The globals of the pickle at the stream's position, which must parse up to its ``STOP`` (and, with
    ``size``, end exactly there: bytes after it are bytes no scan has read); :class:`UnsafeCheckpointError`
    otherwise (a missing pickle, at the end of the file, does not parse either)."""
    try:
        names = _pickle_globals(stream)
    except Exception as exc:  # noqa: BLE001 - truncated, an unknown opcode, ...: fail closed
        raise UnsafeCheckpointError(f"{where}: does not parse as a pickle ({type(exc).__name__}: {exc}); "
                                    "refused (only what the scan could read is let through)") from None
    end = stream.tell()
    if size is not None and end != size:
        raise UnsafeCheckpointError(f"{where}: {size - end} bytes after the pickle's STOP; refused")
    return names


def _check_plain(obj: Any, where: str = "checkpoint") -> None:
    """Only tensors, numbers, strings and None inside dicts / lists / tuples."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (bool, int, float, str)):
        return
    if isinstance(obj, (dict, OrderedDict)):
        for k, v in obj.items():
            if not isinstance(k, (str, int)):
                raise UnsafeCheckpointError(f"{where}: key of type {type(k).__name__} (expected str)")
            _check_plain(v, f"{where}[{k!r}]")
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _check_plain(v, f"{where}[{i}]")
        return
    raise UnsafeCheckpointError(f"{where}: object of type {type(obj).__name__} is not a tensor or a dict of tensors")


def read_checkpoint(path: str | Path) -> Any:
    """Load a ``.safetensors`` file, or a pickled ``.pt`` / ``.pth`` through torch's allow-list unpickler.

    Pickles that reference anything beyond tensors, storages and ordered dicts (numpy arrays, optimiser
    objects, arbitrary classes) are refused with :class:`UnsafeCheckpointError` naming the offending globals;
    nothing in them is executed.
    Tensors saved on a GPU are mapped to the CPU.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if path.suffix == ".safetensors":
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(str(path))
        except SafetensorError as exc:  # e.g. a pickle renamed .safetensors: refused, never unpickled
            with open(path, "rb") as f:
                head = f.read(4)
            what = " (it looks like a pickle / torch checkpoint renamed .safetensors: rewardkit never unpickles " \
                   "a file by another name)" if head[:1] == b"\x80" or head == _ZIP_MAGIC else ""
            raise UnsafeCheckpointError(f"{path}: not a readable safetensors file ({exc}){what}") from None
    with open(path, "rb") as f:
        head = f.read(4)
    if path.suffix not in _PICKLE_SUFFIXES and head[:2] != b"PK":
        raise ValueError(f"{path}: unknown checkpoint format (expected .safetensors, .pt or .pth)")
    scan_pickle(path)
    try:
        obj = torch.load(str(path), map_location="cpu", weights_only=True, mmap=head[:2] == b"PK")
    except Exception as exc:  # torch raises UnpicklingError naming the refused global
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnsafeCheckpointError(
            f"{path}: refused to read this pickle: it holds objects other than tensors, storages and ordered "
            f"dicts ({msg}). rewardkit never unpickles arbitrary objects; convert a weights-only checkpoint "
            "(e.g. HPS_v2.1_compressed.pt, not HPS_v2.pt).") from None
    _check_plain(obj, path.name)
    return obj


def state_dict_from(obj: Any, *keys: str) -> dict[str, torch.Tensor]:
    """The flat tensor dict inside a loaded checkpoint (``obj[key]`` for the first key present, else ``obj``);
    a leading ``module.`` (DataParallel) is stripped."""
    if not isinstance(obj, dict):
        raise ValueError(f"checkpoint is a {type(obj).__name__}, expected a dict of tensors")
    for k in keys:
        if k in obj and isinstance(obj[k], dict):
            obj = obj[k]
            break
    out = {}
    for k, v in obj.items():
        if not isinstance(v, torch.Tensor):
            continue
        out[k[len("module."):] if k.startswith("module.") else k] = v
    if not out:
        raise ValueError(f"no tensors found in the checkpoint (top-level keys: {sorted(obj)[:10]})")
    return out


def resolve_source(src: str | Path, hub_files: tuple[str, ...] = ()) -> Path:
    """A local checkpoint file as is; else, for ``org/name`` hub ids, the first of ``hub_files`` (safetensors
    only: pickles are never downloaded here) fetched with ``huggingface_hub``."""
    import re

    p = Path(src).expanduser()
    if p.exists():
        return p
    if hub_files and re.fullmatch(r"[\w.-]+/[\w.-]+", str(src)):
        hub = __import__("huggingface_hub")
        errors = []
        for fname in hub_files:
            if not fname.endswith(".safetensors"):
                continue
            try:
                return Path(hub.hf_hub_download(str(src), fname))
            except Exception as exc:  # try the next name; report all at the end
                errors.append(f"{fname}: {type(exc).__name__}: {exc}")
        raise FileNotFoundError(f"{src!r} is not a local file and no safetensors file could be downloaded from "
                                f"the hub ({'; '.join(errors) or 'no candidates'})")
    raise FileNotFoundError(f"checkpoint not found: {src}")


def sha256_of(path: str | Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                break
            h.update(b)
    return h.hexdigest()


def check_dst(dst: str | Path, overwrite: bool) -> None:
    """Fail before any work when ``dst`` exists and ``overwrite`` is off."""
    if Path(dst).exists() and not overwrite:
        raise FileExistsError(f"{dst} exists; pass --overwrite (overwrite=True) to replace it")


def write_converted(dst: str | Path, reward: str, writer: Callable[[Path], dict[str, Any] | None], *,
                    source: str | Path | None = None, overwrite: bool = False, **manifest: Any) -> Path:
    """Write a converted directory atomically: ``writer(tmp_dir)`` writes the weights and processor files and
    may return extra manifest entries; then ``rewardkit.json`` names the reward. Readers never see half a
    directory; an existing ``dst`` is replaced only with ``overwrite``."""
    dst = Path(dst)
    check_dst(dst, overwrite)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        extra = writer(tmp) or {}
        man = {"format": FORMAT, "format_version": FORMAT_VERSION, "reward": reward,
               "converted_by": f"rewardkit {__version__}", **manifest, **extra}
        if source is not None:
            src = Path(source)
            man["source"] = {"file": src.name, "sha256": sha256_of(src) if src.is_file() else None}
        (tmp / MANIFEST).write_text(json.dumps(man, indent=2), encoding="utf-8")
        if dst.exists():
            old = dst.parent / f".{dst.name}.old-{os.getpid()}"
            os.replace(dst, old)
            os.replace(tmp, dst)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dst


def read_manifest(path: str | Path, reward: str) -> dict[str, Any]:
    """The ``rewardkit.json`` of a converted directory, checked to name ``reward``; a clear error otherwise
    (including the case of an unconverted official checkpoint, which the runtime never unpickles)."""
    p = Path(path)
    if p.is_file():
        hint = (f" It looks like an official checkpoint file: convert it once with "
                f"`rewardkit convert {reward} {p} OUT_DIR` and pass model=OUT_DIR.")
        raise ValueError(f"{p} is a file, not a converted rewardkit directory.{hint}")
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such directory (convert the official checkpoint with "
                                f"`rewardkit convert {reward} SRC {p}`)")
    mf = p / MANIFEST
    if not mf.is_file():
        raise ValueError(f"{p} has no {MANIFEST}: not written by `rewardkit convert {reward}`")
    man = json.loads(mf.read_text(encoding="utf-8"))
    if man.get("format") != FORMAT or int(man.get("format_version", 0)) > FORMAT_VERSION:
        raise ValueError(f"{mf}: unsupported format {man.get('format')!r} v{man.get('format_version')}")
    if man.get("reward") != reward:
        raise ValueError(f"{p} was converted for reward {man.get('reward')!r}, not {reward!r}")
    return man
