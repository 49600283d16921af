"""The pickle allow-list scanner reads exactly the bytes ``torch.load`` will unpickle and fails closed on anything
it cannot parse; a file that is not what its name says exits 2, never "internal error". Nothing here is ever
unpickled by the scan (the evil global would print)."""

from __future__ import annotations

import io
import pickle
import zipfile
from collections import OrderedDict

import pytest
import torch

from rewardkit.convert._io import UnsafeCheckpointError, read_checkpoint, scan_pickle


class _Evil:
    def __reduce__(self):
        return (print, ("pwned",))


def _legacy(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=False)
    return buf.getvalue()


def _zip(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def test_polyglot_legacy_pickle_with_a_benign_zip_appended(tmp_path, capsys):
    """Bug: ``zipfile.is_zipfile`` accepts a zip anywhere in the file, so a legacy pickle (what torch.load reads,
    its format decided by the first four bytes) followed by a benign zip was scanned as the zip."""
    poly = tmp_path / "poly.pt"
    poly.write_bytes(_legacy({"w": torch.zeros(2), "x": _Evil()}) + _zip(OrderedDict(w=torch.ones(2))))
    assert zipfile.is_zipfile(poly)                        # what the old scan looked at
    assert poly.read_bytes()[:4] != b"PK\x03\x04"          # what torch looks at: a legacy pickle
    with pytest.raises(UnsafeCheckpointError, match="print"):
        scan_pickle(poly)
    with pytest.raises(UnsafeCheckpointError):
        read_checkpoint(poly)
    assert "pwned" not in capsys.readouterr().out


def test_legacy_pickle_that_stops_parsing_is_refused(tmp_path):
    """Bug: the scan of a legacy file stopped silently at a pickle that did not parse (and let the file through)."""
    data = _legacy({"w": torch.ones(3)})
    cut = tmp_path / "cut.pt"
    # cut inside the 4th pickle (the data): the first three parse
    f = io.BytesIO(data)
    for _ in range(3):
        pickle.load(f)
    cut.write_bytes(data[: f.tell() + 5])
    with pytest.raises(UnsafeCheckpointError, match="does not parse"):
        scan_pickle(cut)
    missing = tmp_path / "three.pt"          # the file ends after three pickles: torch would read a fourth
    missing.write_bytes(data[: f.tell()])
    with pytest.raises(UnsafeCheckpointError, match="legacy pickle 'data': does not parse"):
        scan_pickle(missing)
    ok = tmp_path / "ok.pt"                  # the whole legacy file (5 pickles + raw storage bytes) passes
    ok.write_bytes(data)
    scan_pickle(ok)
    assert torch.equal(read_checkpoint(ok)["w"], torch.ones(3))


def test_zip_members_are_all_scanned_and_duplicates_refused(tmp_path):
    ok = tmp_path / "ok.pt"
    ok.write_bytes(_zip(OrderedDict(w=torch.ones(2))))
    scan_pickle(ok)
    dup = tmp_path / "dup.pt"
    with zipfile.ZipFile(ok) as src, zipfile.ZipFile(dup, "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info))
        evil = pickle.dumps(_Evil(), protocol=2)
        with pytest.warns(UserWarning, match="Duplicate name"):
            dst.writestr(next(i.filename for i in src.infolist() if i.filename.endswith("data.pkl")), evil)
    with pytest.raises(UnsafeCheckpointError, match="listed twice"):
        scan_pickle(dup)
    trailing = tmp_path / "trailing.pt"      # bytes after a member pickle's STOP were never scanned
    with zipfile.ZipFile(ok) as src, zipfile.ZipFile(trailing, "w") as dst:
        for info in src.infolist():
            extra = b"\x80\x02c__builtin__\nprint\n." if info.filename.endswith("data.pkl") else b""
            dst.writestr(info, src.read(info) + extra)
    with pytest.raises(UnsafeCheckpointError, match="after the pickle's STOP"):
        scan_pickle(trailing)
    fake = tmp_path / "fake.pt"              # starts like a zip, is not one
    fake.write_bytes(b"PK\x03\x04" + b"\x00" * 64)
    with pytest.raises(UnsafeCheckpointError, match="not a readable zip"):
        scan_pickle(fake)


def test_zip_appended_to_a_zip_of_the_same_layout_is_refused(tmp_path):
    """Bug: Python's zipfile reads the last end record's directory shifted by the bytes in front of it (its
    "concat"); torch's reader takes the recorded offsets as they are. ``evil_zip + benign_zip`` (same member
    sizes) was scanned as the benign zip while ``torch.load`` read the first one."""
    evil, benign = _zip(OrderedDict(w=torch.ones(4))), _zip(OrderedDict(w=torch.zeros(4)))
    assert len(evil) == len(benign)
    poly = tmp_path / "poly.pt"
    poly.write_bytes(evil + benign)
    with zipfile.ZipFile(poly) as zf:                      # what the scan reads: the benign (second) archive
        assert min(i.header_offset for i in zf.infolist()) == len(evil)
    assert torch.equal(torch.load(poly, weights_only=True)["w"], torch.ones(4))  # what torch reads: the first
    with pytest.raises(UnsafeCheckpointError, match="bytes before the archive"):
        scan_pickle(poly)
    tail = tmp_path / "tail.pt"                            # a zip with bytes after it: both read the zip
    tail.write_bytes(benign + _legacy({"w": torch.ones(1)}))
    scan_pickle(tail)


def test_pkl_member_in_another_case_is_scanned(tmp_path, capsys):
    """Bug: torch's reader finds ``archive/data.pkl`` ignoring case, so an unscanned ``archive/data.PKL`` next to
    the real one was what ``torch.load`` unpickled (with the upper-case member after the real one)."""
    ok = tmp_path / "ok.pt"
    ok.write_bytes(_zip(OrderedDict(w=torch.ones(2))))
    for name in ("archive/data.PKL", "archive/extra.Pkl"):
        bad = tmp_path / f"{name.rsplit('/', 1)[1]}.pt"
        with zipfile.ZipFile(ok) as src, zipfile.ZipFile(bad, "w") as dst:
            for info in src.infolist():
                dst.writestr(info, src.read(info))
            dst.writestr(name, pickle.dumps(_Evil(), protocol=2))
        match = "listed twice" if name.endswith("data.PKL") else "print"
        with pytest.raises(UnsafeCheckpointError, match=match):
            scan_pickle(bad)
    assert "pwned" not in capsys.readouterr().out


def test_tar_whose_header_parses_as_five_pickles_is_refused_by_the_scan(tmp_path):
    """Bug: a tar named ``N.N.N.N.N.`` (five tiny pickles: NONE, STOP) passed the legacy scan, while torch.load
    tries the legacy .tar layout first and would unpickle the tar's ``pickle`` member, which no scan read (only
    torch's weights-only refusal of .tar files stopped it). Refused by the scan itself now."""
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("N.N.N.N.N.", b""), ("pickle", pickle.dumps(_Evil(), protocol=2)), ("storages", b""),
                           ("tensors", b"")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    bad = tmp_path / "model.bin"
    bad.write_bytes(buf.getvalue())
    with pytest.raises(UnsafeCheckpointError, match="tar archive"):
        scan_pickle(bad)
    ok = tmp_path / "ok.pt"                               # an ordinary legacy file is no tar
    ok.write_bytes(_legacy({"w": torch.ones(1)}))
    scan_pickle(ok)


def test_pickle_renamed_safetensors_exits_2(tmp_path, capsys):
    """Bug: a pickle renamed ``.safetensors`` reached safetensors' own error: exit 1, "please report it"."""
    from rewardkit.cli import main

    fake = tmp_path / "model.safetensors"
    fake.write_bytes(_zip(OrderedDict(w=torch.ones(2))))
    with pytest.raises(UnsafeCheckpointError, match="renamed .safetensors"):
        read_checkpoint(fake)
    assert main(["convert", "aesthetic", str(fake), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "renamed .safetensors" in err and "please report" not in err
    assert not (tmp_path / "out").exists()


def test_model_directory_with_a_pickle_renamed_safetensors_exits_2(tiny_clip_dir, tmp_path, capsys):
    """The runtime path too: a model directory whose ``model.safetensors`` is a pickle is refused with exit 2 (it
    was "internal error ... please report it", exit 1), and nothing is unpickled."""
    import shutil

    from PIL import Image

    from rewardkit.cli import main

    bad = tmp_path / "clip"
    shutil.copytree(tiny_clip_dir, bad)
    (bad / "model.safetensors").write_bytes(_zip(OrderedDict(w=torch.ones(2))))
    Image.new("RGB", (16, 16), "red").save(tmp_path / "a.png")
    assert main(["score", str(tmp_path / "a.png"), "--prompt", "x", "--reward", "clipscore", "--model", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a readable safetensors file" in err and "please report" not in err


def _torch_zip_with(path, name_suffix: str, payload: bytes | None = None, flag_bits: int = 0,
                    method: int | None = None):
    """A torch zip checkpoint whose member ending in ``name_suffix`` gets ``payload`` (its own bytes by default)
    and, patched into its local header and its central directory entry (zipfile's writer sets both fields
    itself), the general-purpose flag bits ``flag_bits`` (local +6, directory +8) and the compression method
    ``method`` (local +8, directory +10; APPNOTE 4.3.7, 4.3.12)."""
    import struct

    ok = _zip(OrderedDict(w=torch.ones(2)))
    with zipfile.ZipFile(io.BytesIO(ok)) as src, zipfile.ZipFile(path, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            dst.writestr(info, data if payload is None or not info.filename.endswith(name_suffix) else payload)
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as zf:
        info = next(i for i in zf.infolist() if i.filename.endswith(name_suffix))
    cd = raw.index(b"PK\x01\x02")
    while raw[cd + 46:cd + 46 + len(info.filename)] != info.filename.encode():
        cd = raw.index(b"PK\x01\x02", cd + 4)
    for local, central, value in ((6, 8, flag_bits), (8, 10, method)):
        if value:
            for at in (info.header_offset + local, cd + central):
                old = struct.unpack("<H", raw[at:at + 2])[0]
                raw[at:at + 2] = struct.pack("<H", old | value if local == 6 else value)
    path.write_bytes(bytes(raw))
    return path


@pytest.mark.parametrize("op", ["INST", "EXT1", "EXT2", "EXT4"])
def test_inst_and_ext_opcodes_name_a_global(tmp_path, op, capsys):
    """``INST`` (protocol 0: ``i module\\nname\\n`` imports the global and calls it) and ``EXT1`` / ``EXT2`` /
    ``EXT4`` (a code in the unpickling process's copyreg extension registry: the global is not in the file) name
    a global as ``GLOBAL`` does. Bug caught: the scan skipped them, so only torch's weights_only stood between a
    file and ``os.system``. The pickles are written by hand (opcodes per pickletools' table)."""
    import pickletools

    from rewardkit.convert._io import _pickle_globals

    body = {"INST": b"(S'echo pwned'\nios\nsystem\n.", "EXT1": b"\x80\x02\x82\x01)R.",
            "EXT2": b"\x80\x02\x83\x01\x01)R.", "EXT4": b"\x80\x02\x84\x01\x00\x00\x01)R."}[op]
    assert op in {o.name for o, _, _ in pickletools.genops(body)}
    expected = [("os", "system")] if op == "INST" else [None]
    assert _pickle_globals(io.BytesIO(body)) == expected
    bad = _torch_zip_with(tmp_path / f"{op}.pt", "data.pkl", body)
    with pytest.raises(UnsafeCheckpointError, match="os.system" if op == "INST" else r"references \?"):
        scan_pickle(bad)
    assert "pwned" not in capsys.readouterr().out


@pytest.mark.parametrize("kind", ["encrypted pickle", "encrypted storage", "unknown compression"])
def test_zip_with_encryption_or_unknown_compression_exits_2(tmp_path, kind, capsys):
    """A zip member zipfile cannot read as plain bytes (encrypted: flag bit 0; compression method 99, AE-x) is a
    refused file: UnsafeCheckpointError and exit 2 with the reason. Bug caught: zipfile's RuntimeError ("password
    required") and NotImplementedError ("compression method not supported") escaped the scan: "internal error",
    exit 1. A storage member counts too (torch reads it after the pickle)."""
    from rewardkit.cli import main

    path = tmp_path / "bad.pt"
    if kind == "encrypted pickle":
        _torch_zip_with(path, "data.pkl", flag_bits=0x1)
        match = "is encrypted"
    elif kind == "encrypted storage":
        _torch_zip_with(path, "data/0", flag_bits=0x1)
        match = "is encrypted"
    else:
        _torch_zip_with(path, "data.pkl", method=99)
        match = "compression method 99"
    with pytest.raises(UnsafeCheckpointError, match=match):
        scan_pickle(path)
    assert main(["convert", "aesthetic", str(path), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert match in err and "internal error" not in err
