"""data_scripts/_download.py: resumable download, checksum refusal, safe extraction, checks."""

import hashlib
import os
import tarfile

import _download
import pytest

from tests.data_scripts.fakes import jpeg_bytes, make_tar, make_zip, md5_of, tar_member

PAYLOAD = os.urandom(300_000)
MD5 = hashlib.md5(PAYLOAD).hexdigest()


@pytest.fixture
def served_file(server):
    (server.root / "files").mkdir()
    (server.root / "files" / "blob.zip").write_bytes(PAYLOAD)
    return f"{server.url}/files/blob.zip"


def test_interrupted_download_resumes(server, served_file, tmp_path, capsys):
    server.drop_after["/files/blob.zip"] = 100_000
    dest = tmp_path / "out" / "blob.zip"
    assert _download.download(served_file, dest, MD5) == dest
    assert md5_of(dest) == MD5 and not dest.with_name("blob.zip.part").exists()
    assert server.requests == [("/files/blob.zip", None), ("/files/blob.zip", "bytes=100000-")]
    err = capsys.readouterr().err
    assert "resuming blob.zip at" in err and "MB/s" in err and "sha256 " + hashlib.sha256(PAYLOAD).hexdigest() in err


def test_part_file_is_resumed_and_a_server_ignoring_ranges_restarts(server, served_file, tmp_path):
    dest = tmp_path / "blob.zip"
    dest.with_name("blob.zip.part").write_bytes(PAYLOAD[:5000])
    _download.download(served_file, dest, MD5)
    assert server.requests[-1] == ("/files/blob.zip", "bytes=5000-") and md5_of(dest) == MD5
    dest.unlink()
    dest.with_name("blob.zip.part").write_bytes(b"x" * 5000)  # would be wrong if appended to
    server.ignore_range = True
    _download.download(served_file, dest, MD5)
    assert md5_of(dest) == MD5


def test_complete_part_file_gets_416_and_is_used(server, served_file, tmp_path):
    dest = tmp_path / "blob.zip"
    dest.with_name("blob.zip.part").write_bytes(PAYLOAD)
    _download.download(served_file, dest, MD5)
    assert server.requests == [("/files/blob.zip", f"bytes={len(PAYLOAD)}-")] and md5_of(dest) == MD5


def test_wrong_checksum_is_refused_and_kept_aside(server, served_file, tmp_path):
    dest = tmp_path / "blob.zip"
    wrong = "0" * 32
    with pytest.raises(_download.ChecksumError, match=rf"blob\.zip: .*MD5 {MD5}, expected {wrong}.*blob\.zip\.bad"):
        _download.download(served_file, dest, wrong)
    assert not dest.exists() and not dest.with_name("blob.zip.part").exists()
    assert md5_of(dest.with_name("blob.zip.bad")) == MD5


def test_complete_file_is_not_downloaded_again(server, served_file, tmp_path):
    dest = tmp_path / "blob.zip"
    dest.write_bytes(PAYLOAD)
    _download.download(served_file, dest, MD5)
    assert server.requests == []


def test_repeated_drops_give_up_with_a_resume_hint(server, served_file, tmp_path, monkeypatch):
    dest = tmp_path / "blob.zip"
    with pytest.raises(_download.DownloadError, match=r"nothing\.zip: HTTP 404"):
        _download.download(f"{server.url}/nothing.zip", dest, MD5)
    calls = []

    def drop(*args):
        calls.append(args)
        raise ConnectionResetError("reset by peer")

    monkeypatch.setattr(_download, "_fetch_once", drop)
    with pytest.raises(_download.DownloadError, match="reset by peer"):
        _download.download(served_file, dest, MD5, retries=2)
    assert len(calls) == 3


# --------------------------------------------------------------------------- extraction

UNSAFE = {
    "zip ../": ("zip", {"ok.txt": b"fine", "../x.txt": b"evil"}, "../x.txt"),
    "zip absolute": ("zip", {"ok.txt": b"fine", "/tmp/abs.txt": b"evil"}, "/tmp/abs.txt"),
    "zip nested ../": ("zip", {"a/../../x.txt": b"evil"}, "a/../../x.txt"),
    "tar ../": ("tar", [tar_member("ok.txt", b"fine"), tar_member("../x.txt", b"evil")], "../x.txt"),
    "tar absolute": ("tar", [tar_member("ok.txt", b"fine"), tar_member("/tmp/abs.txt", b"evil")], "/tmp/abs.txt"),
    "tar symlink out": (
        "tar",
        [tar_member("ok.txt", b"fine"), tar_member("l", kind=tarfile.SYMTYPE, link="../x")],
        "l",
    ),
    "tar symlink absolute": ("tar", [tar_member("l", kind=tarfile.SYMTYPE, link="/etc/passwd")], "l"),
    "tar hardlink out": ("tar", [tar_member("ok.txt", b"f"), tar_member("h", kind=tarfile.LNKTYPE, link="../x")], "h"),
    "tar through own link": (
        "tar",
        [tar_member("d", kind=tarfile.SYMTYPE, link="."), tar_member("d/l", kind=tarfile.SYMTYPE, link="..")],
        "d/l",
    ),
    "tar device": ("tar", [tar_member("dev", kind=tarfile.CHRTYPE)], "dev"),
    "tar fifo": ("tar", [tar_member("fifo", kind=tarfile.FIFOTYPE)], "fifo"),
}


@pytest.mark.parametrize("case", UNSAFE)
def test_unsafe_archives_are_refused_whole(case, tmp_path):
    kind, members, culprit = UNSAFE[case]
    archive = (make_zip if kind == "zip" else make_tar)(tmp_path / "in" / f"a.{kind}", members)
    out = tmp_path / "deep" / "out"
    with pytest.raises(_download.UnsafeArchiveError, match=rf"a\.{kind}: member '{culprit}'") as err:
        _download.extract(archive, out)
    assert "refusing to extract anything" in str(err.value)
    assert not out.exists()  # not even ok.txt
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a." + kind, "in"]


def test_safe_archive_with_inner_links_extracts(tmp_path):
    members = [
        tar_member("pkg/", kind=tarfile.DIRTYPE),
        tar_member("pkg/data/a.txt", b"alpha"),
        tar_member("pkg/latest.txt", kind=tarfile.SYMTYPE, link="data/a.txt"),
        tar_member("pkg/data/up.txt", kind=tarfile.SYMTYPE, link="../latest.txt"),
        tar_member("pkg/copy.txt", kind=tarfile.LNKTYPE, link="pkg/data/a.txt"),
        tar_member("pkg/./data/../b.txt", b"beta"),
    ]
    archive = make_tar(tmp_path / "a.tar.gz", members, mode="w:gz")
    out = tmp_path / "out"
    assert _download.extract(archive, out) == len(members)
    assert (out / "pkg" / "latest.txt").read_text() == "alpha" and (out / "pkg" / "latest.txt").is_symlink()
    assert (out / "pkg" / "data" / "up.txt").read_text() == "alpha"
    assert (out / "pkg" / "copy.txt").read_text() == "alpha" and (out / "pkg" / "b.txt").read_text() == "beta"
    zipped = make_zip(tmp_path / "b.zip", {"top/": b"", "top/x.txt": b"x", "top/./y.txt": b"y"})
    assert _download.extract(zipped, out) == 3 and (out / "top" / "y.txt").read_text() == "y"


def test_zip_rename_keeps_what_it_names_and_refuses_a_name_that_climbs_out(tmp_path):
    zipped = make_zip(tmp_path / "a.zip", {"train/": b"", "train/d/x.txt": b"x", "train/d/y.bin": b"y"})
    out = tmp_path / "out"
    keep = _download.extract_zip(
        zipped, out, lambda name: name.removeprefix("train/") if name.endswith(".txt") else None
    )
    assert keep == 1 and sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == ["d", "d/x.txt"]
    with pytest.raises(_download.UnsafeArchiveError, match=r"a\.zip: member 'train/d/x.txt' climbs out"):
        _download.extract_zip(zipped, tmp_path / "out2", lambda name: "../" + name)
    assert not (tmp_path / "out2").exists() and not (tmp_path / "train").exists()


def test_neither_zip_nor_tar(tmp_path):
    (tmp_path / "x.zip").write_bytes(b"not an archive")
    with pytest.raises(_download.DataScriptError, match=r"x\.zip: neither a zip nor a tar"):
        _download.extract(tmp_path / "x.zip", tmp_path / "out")


def test_checks_of_the_result(tmp_path):
    for split, n in (("train", 3), ("val", 2)):
        (tmp_path / split).mkdir()
        for i in range(n):
            (tmp_path / split / f"{i}.jpg").write_bytes(jpeg_bytes(i))
    assert _download.check_folders(tmp_path, {"train": 3, "val": 2}, "*.jpg") == []
    (tmp_path / "val" / "0.jpg").write_bytes(b"garbage")
    problems = _download.check_folders(tmp_path, {"train": 4, "val": 2, "test": 1}, "*.jpg")
    assert problems[0] == f"{tmp_path / 'train'}: 3 files matching *.jpg, expected 4"
    assert problems[1].startswith(f"{tmp_path / 'val' / '0.jpg'}: does not decode")
    assert problems[2:] == [f"{tmp_path / 'test'}: missing folder (expected 1 files matching *.jpg)"]


def test_complete_file_with_a_wrong_checksum_is_set_aside_and_fetched_again(server, served_file, tmp_path):
    dest = tmp_path / "blob.zip"
    dest.write_bytes(b"stale")
    _download.download(served_file, dest, MD5)
    assert md5_of(dest) == MD5 and dest.with_name("blob.zip.bad").read_bytes() == b"stale"
