"""Offline synthetic depth: rendered rooms with exact depth, in NYU Depth v2's layout.

A pinhole camera at a random height looks level (its horizon at a random row) over a
chequered floor that recedes to a back wall; boxes and spheres stand on the floor at known
distances. Floor and wall textures are laid out in metres, so tiles shrink with distance,
objects shrink with distance and stand higher in the image the further they are, and a
little haze darkens what is far: the perspective cues a network learns depth from. Depth is
ray-traced (a z-buffer of the floor plane, the wall plane, the boxes' fronts and the
spheres), so every pixel has its exact value: 0.5 to 10 m, NYU's range.

The scenes are written once (`WrittenOnFirstUse`) as NYU's files, RGB JPEG and 16-bit depth
PNG in millimetres with BTS's split files, and read by the same `DepthDataModule` as NYU.
Every scene is a pure function of (seed, split, index).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vitdense.data.base import LoaderConfig, Triple
from vitdense.data.depth import DepthDataModule
from vitdense.data.synthetic.classification import WrittenOnFirstUse, split_seed

#: the depth range of the scenes (metres): nearest object, farthest wall
NEAR, FAR = 0.5, 9.5


def render_scene(height: int, width: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, float]:
    """One room: ([height, width, 3] uint8 image, [height, width] float32 depth in metres,
    focal length in pixels)."""
    image, depth, focal, _, _ = render_surfaces(height, width, rng)
    return image, depth, focal


def render_surfaces(
    height: int, width: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, float, np.ndarray, list[str]]:
    """`render_scene`'s room and what each pixel shows: (image, depth, focal, surface
    [height, width] int64: 0 the wall, 1 the floor, 2 + k the k-th object, kinds: each
    object's "box" or "sphere")."""
    kinds: list[str] = []
    focal = 0.75 * width  # (NYU: 519 / 640 = 0.81)
    cx, horizon = (width - 1) / 2, rng.uniform(0.15, 0.4) * height
    camera_height = rng.uniform(1.2, 2.2)
    wall = rng.uniform(6.0, FAR)
    v, u = np.mgrid[:height, :width].astype(np.float64)
    # the ray through each pixel, with z = 1: depth along the optical axis is its t
    rx, ry = (u - cx) / focal, -(v - horizon) / focal
    depth = np.full((height, width), wall)  # the back wall, fronto-parallel
    surface = np.zeros((height, width), dtype=np.int64)  # 0 wall, 1 floor, 2.. objects
    floor = np.where(ry < 0, camera_height / np.maximum(-ry, 1e-9), np.inf)
    on_floor = floor < depth
    depth[on_floor], surface[on_floor] = floor[on_floor], 1
    colours = {0: rng.uniform(0.35, 0.9, 3), 1: rng.uniform(0.2, 0.8, (2, 3))}
    shading = np.ones((height, width))
    for k in range(int(rng.integers(1, 5))):
        z = rng.uniform(1.2, wall - 0.5)
        x = rng.uniform(-0.5, 0.5) * width / focal * z  # within the view at its distance
        colours[k + 2] = rng.uniform(0.15, 1.0, 3)
        kinds.append("box" if rng.random() < 0.5 else "sphere")
        if kinds[-1] == "box":  # its front face at depth z, on the floor
            half, tall = rng.uniform(0.15, 0.5), rng.uniform(0.3, 1.6)
            px, py = rx * z, ry * z
            hit = (np.abs(px - x) <= half) & (py >= -camera_height) & (py <= -camera_height + tall)
            t = np.where(hit, z, np.inf)
            face_shade = np.full((height, width), rng.uniform(0.7, 1.0))
        else:  # a sphere resting on the floor
            r = rng.uniform(0.2, 0.6)
            centre = np.array([x, -camera_height + r, z])
            dd = rx**2 + ry**2 + 1.0
            b = rx * centre[0] + ry * centre[1] + centre[2]
            disc = b**2 - dd * (centre @ centre - r**2)
            t = np.where(disc >= 0, (b - np.sqrt(np.maximum(disc, 0))) / dd, np.inf)
            normal_z = -(t - centre[2]) / r  # towards the camera: lit from the front
            face_shade = 0.35 + 0.65 * np.clip(normal_z, 0, 1)
        nearer = t < depth
        depth[nearer], surface[nearer], shading[nearer] = t[nearer], k + 2, face_shade[nearer]
    image = np.empty((height, width, 3))
    px, py = rx * depth, ry * depth  # world x and height of every pixel's surface point
    for s in np.unique(surface):
        where = surface == s
        if s == 1:  # floor: 0.5 m tiles in (x, z)
            tile = ((np.floor(px / 0.5) + np.floor(depth / 0.5)) % 2).astype(np.int64)
            image[where] = colours[1][tile[where]]
        elif s == 0:  # wall: 0.7 m panels
            panel = (np.floor(px / 0.7) + np.floor(py / 0.7)) % 2
            image[where] = colours[0] * (0.8 + 0.2 * panel[where, None])
        else:  # objects: 0.2 m stripes, so that their texture shrinks with distance too
            stripes = np.floor(py / 0.2) % 2
            image[where] = colours[s] * (shading[where, None] * (0.85 + 0.15 * stripes[where, None]))
    haze = np.exp(-0.06 * depth)[..., None]  # far is dimmer and greyer
    image = image * haze + 0.5 * (1 - haze)
    image = np.clip(image + rng.normal(0, 0.02, image.shape), 0, 1)
    return np.round(image * 255).astype(np.uint8), depth.astype(np.float32), focal, surface, kinds


def write_synthetic_depth(
    root: str | Path, folder: str, list_name: str, length: int, size: tuple[int, int], seed: int
) -> None:
    """`length` scenes of (H, W) `size` written under `root/folder` as NYU's files (scenes of
    50 images, rgb_#####.jpg and sync_depth_#####.png in mm), listed in `root/list_name`."""
    root = Path(root)
    lines = []
    for i in range(length):
        image, depth, focal = render_scene(*size, np.random.default_rng([seed, i]))
        scene = f"scene_{i // 50:03d}"
        (root / folder / scene).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / folder / scene / f"rgb_{i:05d}.jpg", quality=95)
        millimetres = np.round(depth * 1000).astype(np.uint16)
        Image.fromarray(millimetres).save(root / folder / scene / f"sync_depth_{i:05d}.png")
        lines.append(f"/{scene}/rgb_{i:05d}.jpg /{scene}/sync_depth_{i:05d}.png {focal:.4f}")
    (root / list_name).write_text("\n".join(lines) + "\n")


SYNTHETIC_DEPTH_LOADER = LoaderConfig(batch_size=16)


class SyntheticDepthDataModule(WrittenOnFirstUse, DepthDataModule):
    """Rendered rooms with exact depth (module docstring), written once under `root` in NYU
    Depth v2's layout and read as NYU is.

    Scenes are `img_size` x (4/3 `img_size`, to whole 16 pixels) (NYU's 3:4); training takes
    `img_size` squares of them with BTS's augmentation; evaluation takes whole scenes.

    Args:
        root: where to write the dataset.
        img_size: the scenes' height, the training crops' side, the backbone's native size.
        train_size, val_size: scenes per split (test and predict use the validation scenes).
        seed: base seed of the generator.
        loader, backbone, mean, std, predict_dir: see `ImageDataModule`.
    """

    kind = "depth"

    def __init__(
        self,
        *,
        root: str = "data/synthetic_depth",
        img_size: int = 64,
        train_size: int = 2000,
        val_size: int = 200,
        seed: int = 0,
        loader: LoaderConfig = SYNTHETIC_DEPTH_LOADER,
        backbone: str | None = None,
        mean: Triple | None = None,
        std: Triple | None = None,
        predict_dir: str | None = None,
    ) -> None:
        self.synthetic = {"img_size": img_size, "train_size": train_size, "val_size": val_size, "seed": seed}
        super().__init__(
            root=root,
            train_list="nyudepthv2_train_files_with_gt.txt",
            test_list="nyudepthv2_test_files_with_gt.txt",
            train_images="sync",
            train_depths="sync",
            test_images="official_splits/test",
            test_depths="official_splits/test",
            depth_scale=1000.0,
            crop_size=(img_size, img_size),
            img_size=img_size,
            loader=loader,
            backbone=backbone,
            mean=mean,
            std=std,
            predict_dir=predict_dir,
        )

    @property
    def scene_size(self) -> tuple[int, int]:
        """(H, W) of the scenes: NYU's 3:4, the width in whole 16 pixels."""
        size = self.synthetic["img_size"]
        return size, max(16, round(size * 4 / 3 / 16) * 16)

    def write_splits(self) -> None:
        s = self.synthetic
        for split, folder, list_name in (
            ("train", self.train_images, self.train_list),
            ("val", self.test_images, self.test_list),
        ):
            seed, length = split_seed(s["seed"], split, s["train_size"], s["val_size"])
            write_synthetic_depth(self.root, folder, list_name, length, self.scene_size, seed)
