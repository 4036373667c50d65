"""Reading images as users have them: EXIF orientation, high bit depths, odd modes, bad files;
and the folder of unlabelled images every DataModule predicts on."""

import numpy as np
import pytest
from PIL import Image, ImageOps

from vitdense.core.errors import DataError
from vitdense.core.images import apply_orientation, decode_image, find_images, read_image


def asymmetric(h: int = 6, w: int = 9) -> np.ndarray:
    """An image whose every pixel differs, so any flip or rotation shows."""
    values = np.arange(h * w * 3, dtype=np.uint8).reshape(h, w, 3)
    return values


@pytest.mark.parametrize("code", range(1, 9))
def test_orientation_equals_pillows_exif_transpose(code, tmp_path):
    path = tmp_path / "photo.png"
    exif = Image.Exif()
    exif[274] = code
    Image.fromarray(asymmetric()).save(path, exif=exif)
    with Image.open(path) as img:
        expected = np.asarray(ImageOps.exif_transpose(img).convert("RGB"))
    np.testing.assert_array_equal(decode_image(path), expected)
    pixels, found = read_image(path)
    assert found == code
    # a label map follows its image: the same turn on a single channel
    np.testing.assert_array_equal(apply_orientation(pixels[..., 0], code), expected[..., 0])


def test_sixteen_bit_images_are_scaled_not_clipped(tmp_path):
    values = np.array([[0, 257, 32896], [65535, 12850, 514]], dtype=np.uint16)
    Image.fromarray(values).save(tmp_path / "deep.png")
    Image.fromarray(values).save(tmp_path / "deep.tif")
    for name in ("deep.png", "deep.tif"):
        image = decode_image(tmp_path / name)
        assert image.dtype == np.uint8 and image.shape == (2, 3, 3)
        np.testing.assert_array_equal(image[..., 0], [[0, 1, 128], [255, 50, 2]])  # value / 257
        assert (image[..., 0] == image[..., 2]).all()  # grey in all three channels


def test_float_images_in_unit_range_are_scaled(tmp_path):
    Image.fromarray(np.array([[0.0, 0.5, 1.0]], dtype=np.float32)).save(tmp_path / "f.tif")
    np.testing.assert_array_equal(decode_image(tmp_path / "f.tif")[..., 1], [[0, 128, 255]])


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "CMYK", "P", "1"])
def test_every_mode_becomes_rgb(mode, tmp_path):
    image = Image.fromarray(asymmetric()).convert(mode)
    path = tmp_path / ("x.jpg" if mode == "CMYK" else "x.png")
    image.save(path)
    decoded = decode_image(path)
    assert decoded.shape == (6, 9, 3) and decoded.dtype == np.uint8


def test_palette_with_transparency(tmp_path):
    image = Image.fromarray(asymmetric()).convert("P")
    image.info["transparency"] = 0
    image.save(tmp_path / "t.png", transparency=0)
    assert decode_image(tmp_path / "t.png").shape == (6, 9, 3)


@pytest.mark.parametrize(
    "content, message",
    [(b"", r"empty file \(0 bytes\)"), (b"not an image at all", "corrupt or unreadable image")],
)
def test_bad_files_are_named(content, message, tmp_path):
    path = tmp_path / "bad.jpg"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message) as err:
        decode_image(path)
    assert str(path) in str(err.value)


def test_truncated_file_is_named(tmp_path):
    path = tmp_path / "cut.jpg"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64, 3), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(DataError, match="corrupt or unreadable image"):
        decode_image(path)


def test_find_images_recurses_skips_hidden_and_counts_the_rest(tmp_path, caplog):
    (tmp_path / "sub").mkdir()
    (tmp_path / ".cache").mkdir()
    for name in ("b.JPG", "a.png", "sub/c.tiff", ".cache/d.png", ".e.png"):
        Image.fromarray(asymmetric()).save(tmp_path / name, format="PNG")
    (tmp_path / "notes.txt").write_text("x")
    found = find_images(tmp_path)
    assert [p.relative_to(tmp_path).as_posix() for p in found] == ["a.png", "b.JPG", "sub/c.tiff"]
    assert "1 files that are not images left out (notes.txt)" in caplog.text


def test_find_images_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="data.predict_dir"):
        find_images(tmp_path / "nowhere")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(DataError, match="no image files"):
        find_images(tmp_path)
