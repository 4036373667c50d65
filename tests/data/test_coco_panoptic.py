"""COCO panoptic and instance-mask data: what EoMT's own code makes of the same files
(`coco_panoptic_reference.pt`, written by /tmp/pandata_ref/ref.py from tue-mps/eomt@7bd19dd:
its target parsers, its LSJ transform with the random draws injected, its evaluation size),
the category mapping, crowds, void, the collate and every bad input."""

import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitdense.core.errors import DataError
from vitdense.core.preprocess import LabelInfo, Preprocess
from vitdense.data import (
    CocoInstanceMaskDataModule,
    CocoPanopticDataModule,
    CocoSegments,
    LoaderConfig,
    PanopticImages,
    load_coco_instance_masks,
    load_coco_panoptic,
    pad_collate,
    panoptic_eval_transforms,
    panoptic_train_transforms,
)
from vitdense.data.transforms.universal import resize_masks, scale_jitter_size
from vitdense.data.universal import SegmentLayers
from vitdense.results.universal import id2rgb

REFERENCE = torch.load(Path(__file__).with_name("coco_panoptic_reference.pt"), weights_only=True)
RAW = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)  # normalisation that leaves pixel / 255
H, W = REFERENCE["ids"].shape


class Draws:
    """A stand-in for a transform's `py_random`: the given draws, in order."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def crop_draw(offset: int, room: int) -> float:
    """albumentations' RandomCrop draw that puts the crop at `offset` (it takes int(room x draw))."""
    return (offset + 0.5) / room


def unpack(bits: torch.Tensor, n: int, h: int, w: int) -> np.ndarray:
    return np.unpackbits(bits.numpy(), count=n * h * w).reshape(n, h, w).astype(bool)


def stuff_only() -> tuple[np.ndarray, np.ndarray, list]:
    """A portrait image without things: sky, a void line, grass."""
    ids = np.full((24, 18), 501, np.int64)
    ids[14:, :] = 777
    ids[13] = 0
    image = np.zeros((24, 18, 3), np.uint8)
    image[ids == 501], image[ids == 777] = (90, 150, 230), (40, 160, 40)
    return image, ids, [(501, 120, 0), (777, 95, 0)]


def small_thing() -> tuple[np.ndarray, np.ndarray, list]:
    """A square image holding one 3 x 3 cup in its top left corner, void elsewhere."""
    ids = np.zeros((40, 40), np.int64)
    ids[:3, :3] = 99
    image = np.full((40, 40, 3), 30, np.uint8)
    image[:3, :3] = 250
    return image, ids, [(99, 7, 0)]


def write_panoptic(root: Path, split: str = "val2017") -> Path:
    """COCO panoptic's layout: the reference scene, an image without things, one with a
    small thing; categories in a JSON order that is not their ids' (7, 3, 120, 95)."""
    scenes = [(REFERENCE["image"].numpy(), REFERENCE["ids"].numpy().astype(np.int64), REFERENCE["segments"])]
    scenes += [stuff_only(), small_thing()]
    (root / split).mkdir(parents=True)
    (root / "annotations" / f"panoptic_{split}").mkdir(parents=True)
    images, annotations = [], []
    for i, (image, ids, segments) in enumerate(scenes):
        name = f"{i + 1:012d}"
        Image.fromarray(image).save(root / split / f"{name}.png")  # lossless: pixels compared exactly
        Image.fromarray(id2rgb(ids)).save(root / "annotations" / f"panoptic_{split}" / f"{name}.png")
        images.append({"id": i + 1, "file_name": f"{name}.png", "height": ids.shape[0], "width": ids.shape[1]})
        info = [{"id": s, "category_id": c, "iscrowd": k, "area": int((ids == s).sum()) + 0.5} for s, c, k in segments]
        annotations.append({"image_id": i + 1, "file_name": f"{name}.png", "segments_info": info})
    del annotations[0]["segments_info"][1]["area"]  # no area given: the pixel count
    categories = [{"id": c, "name": n, "isthing": t, "color": [c, 2 * c, 0]} for c, n, t in REFERENCE["categories"]]
    path = root / "annotations" / f"panoptic_{split}.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def write_instances(root: Path, split: str = "val2017") -> Path:
    """COCO instances' layout: the reference scene's instances (polygons, one slightly outside
    the image, a crowd as an uncompressed RLE) plus the crowd again as a compressed RLE; an
    image without annotations."""
    (root / split).mkdir(parents=True, exist_ok=True)
    Image.fromarray(REFERENCE["image"].numpy()).save(root / split / "a.png")
    Image.fromarray(stuff_only()[0]).save(root / split / "b.png")
    images = [{"id": 1, "file_name": "a.png", "height": H, "width": W}]
    images.append({"id": 2, "file_name": "b.png", "height": 24, "width": 18})
    anns = [
        {"id": a, "image_id": 1, "category_id": c, "iscrowd": k, "segmentation": s, "area": 10.0 + a}
        for a, c, k, s in REFERENCE["instances"]
    ]
    anns.append({"id": 15, "image_id": 1, "category_id": 3, "iscrowd": 1, "segmentation": REFERENCE["string_rle"]})
    categories = [{"id": c, "name": n} for c, n, _ in REFERENCE["categories"] if c in (7, 3)]
    (root / "annotations").mkdir(exist_ok=True)
    path = root / "annotations" / f"instances_{split}.json"
    path.write_text(json.dumps({"images": images, "annotations": anns, "categories": categories}))
    return path


@pytest.fixture(scope="module")
def coco(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("coco")
    write_panoptic(root)
    write_instances(root)
    return root


def panoptic_index(root: Path):
    return load_coco_panoptic(
        root / "annotations" / "panoptic_val2017.json", root / "val2017", root / "annotations" / "panoptic_val2017"
    )


def masks_of(numbers: torch.Tensor, n: int) -> torch.Tensor:
    return numbers[None] == torch.arange(1, n + 1, dtype=numbers.dtype)[:, None, None]


# ------------------------------------------------------------------ what EoMT makes of the same files
def test_panoptic_targets_are_eomts(coco):
    """PNG ids -> one mask per segments_info entry, labels in the JSON's category order
    (cup 7 -> 0, dog 3 -> 1, wall 120 -> 2, floor 95 -> 3), crowds kept for evaluation only."""
    index = panoptic_index(coco)
    assert index.categories.ids == [7, 3, 120, 95] and index.categories.is_thing == [True, True, False, False]
    expected = REFERENCE["panoptic"]
    sample = CocoSegments(index, panoptic_eval_transforms(max(H, W), *RAW))[0]  # long side already 53: no resize
    full = sample.eval_targets
    assert torch.equal(full.masks, masks_of(expected["masks"], 6))
    assert torch.equal(full.labels, expected["labels"]) and torch.equal(full.iscrowd, expected["iscrowd"])
    pixels = full.masks.flatten(1).sum(1).float()
    assert full.area[1] == pixels[1] and torch.equal(full.area[[0, 2, 3, 4, 5]], pixels[[0, 2, 3, 4, 5]] + 0.5)
    assert not full.masks.sum(0)[REFERENCE["ids"] == 0].any()  # void stays void
    # training-style targets: the crowd left out, at the image's pixels
    crowd = expected["iscrowd"]
    assert torch.equal(sample.targets.masks, full.masks[~crowd]) and torch.equal(
        sample.targets.labels, full.labels[~crowd]
    )
    assert not sample.targets.iscrowd.any() and sample.orig_sizes == (H, W) == sample.image_sizes


@pytest.mark.parametrize("case", range(len(REFERENCE["lsj"])))
def test_large_scale_jitter_is_eomts(coco, case):
    """Flip, ScaleJitter, black padding, RandomCrop and the drop of vanished segments, with
    EoMT's draws: the same image to the last bit and the same masks."""
    ref = REFERENCE["lsj"][case]
    size, scale_range = REFERENCE["lsj_size"], tuple(REFERENCE["lsj_range"])
    assert scale_jitter_size(H, W, size, scale_range, ref["u"]) == tuple(ref["scaled"])
    transform = panoptic_train_transforms(size, scale_range, *RAW, hflip=1.0 if ref["flip"] else 0.0)
    jitter, crop = transform.transforms[1], transform.transforms[3]
    jitter.py_random = Draws(ref["u"])
    (sh, sw) = ref["scaled"]
    crop.py_random = Draws(
        crop_draw(ref["top"], max(sh, size) - size + 1), crop_draw(ref["left"], max(sw, size) - size + 1)
    )
    sample = CocoSegments(panoptic_index(coco), transform, with_eval_targets=False)[0]
    assert torch.equal(torch.round(sample.image * 255).to(torch.uint8), ref["image"])
    assert torch.equal(sample.targets.masks, masks_of(ref["masks"], len(ref["labels"])))
    assert torch.equal(sample.targets.labels, ref["labels"]) and sample.eval_targets is None


def test_large_scale_jitter_keeps_masks_on_their_pixels(coco):
    """Random draws (flips, scales, crops): every target mask lies on a segment of its class,
    the one whose (solid) colour is nearest the mask's median colour."""
    index = panoptic_index(coco)
    colours = torch.stack([REFERENCE["image"][REFERENCE["ids"] == sid][0] for sid, _, _ in REFERENCE["segments"]])
    transform = panoptic_train_transforms(32, (0.75, 2.0), *RAW)
    transform.set_random_seed(0)
    dataset = CocoSegments(index, transform, with_eval_targets=False, tries=10)
    checked = 0
    for _ in range(12):
        sample = dataset[0]
        pixels = sample.image.permute(1, 2, 0) * 255
        for mask, label in zip(sample.targets.masks, sample.targets.labels, strict=True):
            if mask.sum() >= 12:  # (the borders blend: a tiny mask is all border)
                median = pixels[mask].median(0).values
                nearest = (colours.float() - median).abs().max(1).values.argmin()
                assert REFERENCE["panoptic"]["labels"][nearest] == label
                checked += 1
    assert checked >= 30


def test_draws_again_when_the_crop_keeps_no_segment(coco):
    """EoMT redraws the augmentation until a segment survives the crop (here at most `tries` times)."""
    index = panoptic_index(coco)

    def dataset(tries: int) -> CocoSegments:
        transform = panoptic_train_transforms(16, (2.0, 2.0), *RAW, hflip=0.0)  # 40 px -> 32, cropped to 16
        room = scale_jitter_size(40, 40, 16, (2.0, 2.0), 0.0)[0] - 16 + 1
        transform.transforms[1].py_random = Draws(0.0, 0.0)
        transform.transforms[3].py_random = Draws(crop_draw(10, room), crop_draw(10, room), 0.0, 0.0)
        return CocoSegments(index, transform, with_eval_targets=False, tries=tries)

    assert dataset(1)[2].targets.masks.shape == (0, 16, 16)  # the cup (top left) is cropped away
    sample = dataset(2)[2]
    assert sample.targets.labels.tolist() == [0] and sample.targets.masks[0, :2, :2].all()


@pytest.mark.parametrize("count, dtype", [(6, np.uint8), (300, np.int32)])
def test_segment_maps_keep_their_numbers(count, dtype):
    """A panoptic map's segment numbers survive selection and nearest resizing, in uint8 or,
    from 255 segments, int32."""
    numbers = np.arange(20 * 30).reshape(20, 30) % (count + 1)
    layers = SegmentLayers.of_map(numbers, count)
    assert layers.layers.dtype == dtype
    keep = np.arange(count) % 2 == 0
    chosen = layers.select(keep)
    assert chosen.count == count // 2 and np.array_equal(chosen.masks(), layers.masks()[keep])
    doubled = resize_masks(chosen.layers, (40, 60))
    assert np.array_equal(chosen.masks(doubled), chosen.masks().repeat(2, 1).repeat(2, 2))


def test_evaluation_resizes_the_long_side_as_eomt(coco):
    preprocess = Preprocess("rescale", 640, *RAW, max_size=640)
    for size, expected in zip(REFERENCE["eval_sizes"], REFERENCE["eval_expected"], strict=True):
        assert preprocess.output_size(*size) == tuple(expected)
    dataset = CocoSegments(panoptic_index(coco), panoptic_eval_transforms(40, *RAW))
    for i, resized in ((0, (28, 40)), (1, (40, 30))):
        sample = dataset[i]
        assert sample.image_sizes == resized and sample.targets.masks.shape[1:] == resized
        assert sample.eval_targets.masks.shape[1:] == sample.orig_sizes  # the annotation's own size
    assert dataset[1].eval_targets.labels.tolist() == [2, 3]  # an image without things


def test_preprocess_is_the_evaluation_transform(coco):
    dm = CocoPanopticDataModule(root=str(coco), img_size=48, eval_size=40, loader=LoaderConfig(batch_size=2))
    rng = np.random.default_rng(0)
    for shape in [(37, 53), (300, 200), (40, 40), (17, 90), (33, 1)]:
        pixels = rng.integers(0, 256, (*shape, 3), dtype=np.uint8)
        assert torch.equal(dm.preprocess()(pixels), dm.eval_transforms()(image=pixels)["image"]), shape


def test_instance_masks_are_eomts_and_cocos(coco, caplog):
    """Polygons (clipped where they stray a little outside), an uncompressed and a compressed
    crowd RLE: EoMT's parser and pycocotools' decode; things only; an image without any."""
    index = load_coco_instance_masks(coco / "annotations" / "instances_val2017.json", coco / "val2017")
    assert index.categories.ids == [7, 3] and index.categories.is_thing == [True, True]
    expected = REFERENCE["instance"]
    sample = CocoSegments(index, panoptic_eval_transforms(max(H, W), *RAW))[0]
    full = sample.eval_targets
    assert torch.equal(full.masks[:4], torch.from_numpy(unpack(expected["masks"], 4, H, W)))
    assert torch.equal(full.masks[4], torch.from_numpy(unpack(expected["string_rle_mask"], 1, H, W)[0]))
    assert torch.equal(full.masks[2], full.masks[4])  # one crowd, in both RLE forms
    assert full.labels.tolist() == [*expected["labels"].tolist(), 1] and full.iscrowd.tolist() == [0, 0, 1, 0, 1]
    assert full.area[:4].tolist() == [21.0, 22.0, 23.0, 24.0]  # the annotation's own
    assert torch.equal(sample.targets.masks, full.masks[[0, 1, 3]])  # crowds out
    empty = CocoSegments(index, panoptic_eval_transforms(24, *RAW))[1]
    assert empty.targets.masks.shape == (0, 24, 18) and empty.eval_targets.masks.shape == (0, 24, 18)


def test_collate_pads_images_and_keeps_targets_per_image(coco):
    dataset = CocoSegments(panoptic_index(coco), panoptic_eval_transforms(40, *RAW))
    samples = [dataset[0], dataset[1]]
    batch = pad_collate(samples)
    assert isinstance(batch, PanopticImages) and batch.image.shape == (2, 3, 40, 40)
    assert batch.image_sizes.sizes == ((28, 40), (40, 30)) and batch.index.tolist() == [0, 1]
    assert (batch.image[0, :, 28:] == 0).all() and (batch.image[1, :, :, 30:] == 0).all()
    assert torch.equal(batch.image[1, :, :, :30], samples[1].image)
    assert batch.targets == (samples[0].targets, samples[1].targets)  # unpadded, each at its image's size
    assert batch.orig_sizes == ((H, W), (24, 18)) and batch.eval_targets[1] is samples[1].eval_targets
    train = pad_collate([CocoSegments(dataset.index, dataset.transform, with_eval_targets=False)[2]] * 2)
    assert train.eval_targets == (None, None)


# ------------------------------------------------------------------ the DataModules
def test_panoptic_datamodule(coco, tmp_path):
    dm = CocoPanopticDataModule(
        root=str(coco),
        train_images="val2017",
        train_annotations="annotations/panoptic_val2017.json",
        train_masks="annotations/panoptic_val2017",
        img_size=32,
        scale_range=(0.5, 1.5),
        loader=LoaderConfig(batch_size=2, num_workers=0),
    )
    # read from the validation JSON on construction, in its order
    assert dm.class_names == ["cup", "dog", "wall", "floor"] and dm.category_ids == [7, 3, 120, 95]
    assert dm.num_classes == 4 and dm.is_thing == [True, True, False, False] and dm.eval_size == 32
    assert dm.hparams["categories"] == {7: "cup", 3: "dog", 120: "wall", 95: "floor"} and dm.hparams["thing_ids"] == [
        7,
        3,
    ]
    info = LabelInfo.of(dm)
    assert info.category_ids == (7, 3, 120, 95) and info.palette[3] == (95, 190, 0)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))
    assert isinstance(batch, PanopticImages) and batch.image.shape == (2, 3, 32, 32)
    assert all(t.masks.shape[1:] == (32, 32) for t in batch.targets) and batch.eval_targets == (None, None)
    val = next(iter(dm.val_dataloader()))
    assert max(val.image_sizes.sizes[0]) == 32 and val.eval_targets[0].masks.shape[1:] == (H, W)
    # a checkpoint's categories rebuild it without the dataset
    rebuilt = CocoPanopticDataModule(root=str(tmp_path), categories=dm.hparams["categories"], thing_ids=[7, 3])
    assert rebuilt.class_names == dm.class_names and rebuilt.is_thing == dm.is_thing
    with pytest.raises(DataError, match="without data.init_args.thing_ids"):
        CocoPanopticDataModule(root=str(tmp_path), categories={1: "a"})
    with pytest.raises(FileNotFoundError, match="data_scripts/coco_panoptic.py --out"):
        CocoPanopticDataModule(root=str(tmp_path / "nowhere"))


def test_instance_datamodule(coco):
    dm = CocoInstanceMaskDataModule(
        root=str(coco), img_size=32, eval_size=53, loader=LoaderConfig(batch_size=1, num_workers=0)
    )
    assert dm.class_names == ["cup", "dog"] and dm.is_thing == [True, True] and dm.category_ids == [7, 3]
    dm.setup("validate")
    batch = next(iter(dm.val_dataloader()))
    assert batch.image.shape == (1, 3, H, W) and len(batch.eval_targets[0].labels) == 5


# ------------------------------------------------------------------ bad input
def spoil_png(root: Path, array: np.ndarray) -> None:
    Image.fromarray(array).save(root / "annotations" / "panoptic_val2017" / "000000000001.png")


def edit(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def panoptic_json(root: Path) -> Path:
    return root / "annotations" / "panoptic_val2017.json"


def instances_json(root: Path) -> Path:
    return root / "annotations" / "instances_val2017.json"


IDS = REFERENCE["ids"].numpy().astype(np.int64)
#: (what, how the copy is spoilt, which reader, when it is caught, the message)
BAD = {
    "PNG ids missing from segments_info": (
        lambda r: spoil_png(r, id2rgb(np.where(IDS == 0, 424242, IDS))), "panoptic", "sample",
        "000000000001.png: segment ids [424242] are in the PNG but not in the segments_info of image id 1",
    ),
    "segments_info id without pixels": (
        lambda r: spoil_png(r, id2rgb(np.where(IDS == 4567890, 0, IDS))), "panoptic", "sample",
        "lists segment ids [4567890], which have no pixel in",
    ),
    "PNG of another size": (
        lambda r: spoil_png(r, id2rgb(IDS[:-1])), "panoptic", "sample", "a panoptic PNG must match its image",
    ),
    "PNG not RGB": (
        lambda r: spoil_png(r, (IDS % 7).astype(np.uint8)), "panoptic", "sample", "a panoptic PNG in PIL mode 'L'",
    ),
    "missing PNG": (
        lambda r: (r / "annotations" / "panoptic_val2017" / "000000000002.png").unlink(), "panoptic", "load",
        "annotations[1] (image id 2) names the PNG '000000000002.png', which is not in",
    ),
    "category not in categories": (
        lambda r: edit(panoptic_json(r), lambda d: d["annotations"][1]["segments_info"][0].update(category_id=42)),
        "panoptic", "load", "segments_info[0] has category_id 42, which 'categories' does not list",
    ),
    "segment id 0": (
        lambda r: edit(panoptic_json(r), lambda d: d["annotations"][2]["segments_info"][0].update(id=0)),
        "panoptic", "load", "segments_info[0] has id 0; segment ids are integers in 1..256³-1 (0 is void)",
    ),
    "image without a panoptic entry": (
        lambda r: edit(panoptic_json(r), lambda d: d["annotations"].pop(1)), "panoptic", "load",
        "image ids [2] have no entry in 'annotations'",
    ),
    "categories without isthing": (
        lambda r: edit(panoptic_json(r), lambda d: d["categories"][0].pop("isthing")), "panoptic", "load",
        "categories[0] has no 'isthing'",
    ),
    "RLE of another size": (
        lambda r: edit(instances_json(r), lambda d: d["annotations"][4]["segmentation"].update(size=[H, W + 1])),
        "instances", "load", "annotations[4] (id 15) has an RLE of size [37, 54] (height, width) but image id 1",
    ),
    "RLE counts short of the image": (
        lambda r: edit(instances_json(r), lambda d: d["annotations"][2]["segmentation"]["counts"].pop()),
        "instances", "sample", "annotation id 13 (image id 1): its RLE counts cover",
    ),
    "polygon far outside": (
        lambda r: edit(instances_json(r), lambda d: d["annotations"][0].update(segmentation=[[10, 8, 90, 8, 90, 30]])),
        "instances", "sample", "annotation id 11 (image id 1): polygon points reach x 10..90",
    ),
    "instance category not in categories": (
        lambda r: edit(instances_json(r), lambda d: d["annotations"][0].update(category_id=120)),
        "instances", "load", "annotations[0] (id 11) has category_id 120, which 'categories' does not list",
    ),
}  # fmt: skip


def spoilt(coco: Path, tmp_path: Path, how) -> Path:
    root = tmp_path / "coco"
    shutil.copytree(coco, root)
    how(root)
    return root


def read(root: Path, reader: str):
    if reader == "panoptic":
        return panoptic_index(root)
    return load_coco_instance_masks(instances_json(root), root / "val2017")


@pytest.mark.parametrize("what", BAD)
def test_bad_input_names_the_file_and_the_fix(what, coco, tmp_path):
    how, reader, when, message = BAD[what]
    root = spoilt(coco, tmp_path, how)
    if when == "load":
        with pytest.raises(DataError) as err:
            read(root, reader)
    else:
        dataset = CocoSegments(read(root, reader), panoptic_eval_transforms(40))
        with pytest.raises(DataError) as err:
            dataset[0]
    assert message in str(err.value) and str(root) in str(err.value)


def test_short_polygon_parts_are_left_out_with_a_count(coco, tmp_path, caplog):
    """A part of two points (pycocotools would take it for a box) is left out; an annotation
    of nothing else is left out too; both counted in the log."""

    def shorten(d):
        d["annotations"][0]["segmentation"].append([1, 1, 5, 5])
        d["annotations"][3]["segmentation"] = [[33.0, 14.0, 41.0, 14.0]]

    root = spoilt(coco, tmp_path, lambda r: edit(instances_json(r), shorten))
    with caplog.at_level(logging.WARNING):
        index = read(root, "instances")
    assert index.images[0].ann_ids == [11, 12, 13, 15]
    assert "2 polygon parts of fewer than 3 points left out; 1 annotations had no other" in caplog.text
    assert "annotations[3] (id 14)" in caplog.text


def test_bad_samples_are_skipped_and_counted(coco, tmp_path, caplog):
    root = spoilt(coco, tmp_path, lambda r: spoil_png(r, id2rgb(IDS[:, :-2])))
    dm = CocoPanopticDataModule(
        root=str(root), img_size=32, loader=LoaderConfig(batch_size=2, num_workers=0, on_bad_sample="skip")
    )
    dm.setup("validate")
    with caplog.at_level(logging.WARNING):
        batches = [b for b in dm.val_dataloader() if b is not None]
    assert sum(len(b.index) for b in batches) == 2 and dm.take_skipped("val") == 1
    assert "skipped a bad sample (on_bad_sample=skip)" in caplog.text and "000000000001.png" in caplog.text
