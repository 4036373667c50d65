"""Every YAML in configs/ is parsed and run for a few steps through the CLI, on tiny fake data
in the real on-disk layout, offline (pretrained weights swapped for random ones)."""

from pathlib import Path

import pytest
import torch
import yaml

from tests.data.test_ade20k import label_map, write_pair
from tests.data.test_cifar import write_fake_cifar
from tests.data.test_coco_panoptic import write_instances
from tests.data.test_depth import write_sample
from tests.data.test_imagefolder import make_split
from vitdense.backbone.pretrained import create_backbone
from vitdense.cli import main
from vitdense.data import write_synthetic_coco, write_synthetic_panoptic, write_synthetic_pose_coco
from vitdense.data.synthetic.keypoints import FIGURE
from vitdense.tasks import FeatureDistillationTask, MaskedImageModelingTask

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.yaml"))
TESTED = {
    "demo_cls.yaml",
    "cls_imagenet.yaml",
    "cls_cifar100.yaml",
    "linprobe_imagenet.yaml",
    "demo_seg.yaml",
    "seg_ade20k.yaml",
    "seg_ade20k_linear.yaml",
    "seg_ade20k_hybrid.yaml",
    "seg_ade20k_large_fsdp.yaml",
    "demo_det.yaml",
    "det_coco.yaml",
    "demo_det_lwdetr.yaml",
    "det_coco_rfdetr.yaml",
    "demo_pretrain.yaml",
    "demo_pretrain_mpp.yaml",
    "demo_distill.yaml",
    "demo_linprobe.yaml",
    "pretrain_mae_imagenet.yaml",
    "pretrain_mpp_imagenet.yaml",
    "demo_panoptic.yaml",
    "demo_seg_eomt.yaml",
    "eomt_ade20k.yaml",
    "eomt_coco_panoptic.yaml",
    "eomt_coco_panoptic_dinov3.yaml",
    "eomt_coco_instance.yaml",
    "demo_depth.yaml",
    "dpt_nyu.yaml",
    "demo_pose.yaml",
    "pose_coco.yaml",
    "demo_multitask.yaml",  # (run by tests/tasks/test_multitask.py: a MultiTask's data is one DataModule per task)
}


def test_every_config_is_tested():
    assert {c.name for c in CONFIGS} == TESTED


def fake_data_args(name: str, data: dict, tmp_path: Path, monkeypatch) -> list[str]:
    """Point the config's DataModule at a tiny dataset of its own layout."""
    class_path = data["class_path"]
    if class_path.endswith("ImageFolderDataModule"):
        root = tmp_path / "imagenet"
        for split in ("train", "val"):
            make_split(root / split, ["bird", "cat", "dog"], per_class=2)
        return [
            f"--data.init_args.root={root}",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith("UnlabeledImagesDataModule"):
        root = tmp_path / "imagenet"
        for split in ("train", "val"):
            make_split(root / split, ["bird", "cat"], per_class=2)  # the class folders are ignored
        return [
            f"--data.init_args.root={root}",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith("CIFARDataModule"):
        write_fake_cifar(tmp_path / "cifar", monkeypatch, data["init_args"]["variant"], per_batch=8)
        return [
            f"--data.init_args.root={tmp_path / 'cifar'}",
            "--data.init_args.download=false",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith("ADE20KDataModule"):
        root = tmp_path / "ADEChallengeData2016"
        for split, prefix in (("training", "train"), ("validation", "val")):
            for i, (h, w) in enumerate([(70, 90), (96, 64), (80, 80)]):
                write_pair(root, split, f"ADE_{prefix}_{i:08d}", label_map(h, w, i, num_labels=151))
        return [
            f"--data.init_args.root={root}",
            "--data.init_args.crop_size=64",
            "--data.init_args.eval_short_side=64",
            "--data.init_args.scale=[256, 64]",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith("COCODataModule"):
        root = tmp_path / "coco"
        keypoints = "person_keypoints" in data["init_args"].get("val_annotations", "")  # COCO's keypoint files
        for split in ("train2017", "val2017"):
            if keypoints:  # the stick figures' 13 keypoints (with their sigmas) in COCO person's place
                written = write_synthetic_pose_coco(root, split, 4, img_size=48, seed=0)
                written.rename(written.with_name(f"person_keypoints_{split}.json"))
            else:
                write_synthetic_coco(root, split, 4, img_size=48, num_classes=3, seed=0)
        figures = [f"--data.init_args.keypoint_sigmas={list(FIGURE.sigmas)}"] if keypoints else []
        figures += ["--model.init_args.head.init_args.num_keypoints=13"] if keypoints else []
        return [
            *figures,
            f"--data.init_args.root={root}",
            "--data.init_args.scales=[64]",
            "--data.init_args.crop_scales=[64]",
            "--data.init_args.crop_size=[32, 64]",
            "--data.init_args.eval_short_side=64",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith(("CocoPanopticDataModule", "CocoInstanceMaskDataModule")):
        root = tmp_path / "coco"
        for split in ("train2017", "val2017"):
            if class_path.endswith("CocoPanopticDataModule"):
                write_synthetic_panoptic(root, split, 3, img_size=48, seed=0)
            else:
                write_instances(root, split)
        return [
            f"--data.init_args.root={root}",
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    if class_path.endswith("NYUDepthDataModule"):
        root = tmp_path / "nyu_depth_v2"
        size = (48, 64)  # NYU's 3:4
        train = [write_sample(root, "sync", i, size=size) for i in range(4)]
        test = [write_sample(root, "official_splits/test", i, size=size) for i in range(4, 6)]
        (root / "nyudepthv2_train_files_with_gt.txt").write_text("\n".join(train) + "\n")
        (root / "nyudepthv2_test_files_with_gt.txt").write_text("\n".join(test) + "\n")
        return [
            f"--data.init_args.root={root}",
            "--data.init_args.crop_size=[32, 48]",
            "--model.init_args.crop=none",  # Eigen's crop is defined on NYU's 480 x 640 maps only
            "--data.init_args.loader.batch_size=2",
            "--data.init_args.loader.num_workers=0",
        ]
    assert class_path.startswith("vitdense.data.Synthetic"), f"{name}: no fake data for {class_path}"
    return [
        "--data.init_args.img_size=64",
        "--data.init_args.train_size=8",
        "--data.init_args.val_size=4",
        "--data.init_args.loader.batch_size=2",
    ]


SINGLE_TASK = [c for c in CONFIGS if c.name != "demo_multitask.yaml"]


@pytest.mark.parametrize("config", SINGLE_TASK, ids=[c.stem for c in SINGLE_TASK])
def test_config_runs_a_few_steps(config, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the configs write checkpoints under runs/
    cfg = yaml.safe_load(config.read_text())
    args = ["fit", "--config", str(config), *fake_data_args(config.name, cfg["data"], tmp_path, monkeypatch)]
    if "img_size" in cfg["data"]["init_args"] and "ADE20K" not in cfg["data"]["class_path"]:
        args.append("--data.init_args.img_size=64")  # the recipe's size costs minutes on a CPU
    backbone = cfg["model"]["init_args"].get("backbone", {})
    if backbone.get("name", "").startswith(("vit_base", "vit_large")) and "model_args" not in backbone:
        # the recipes' ViT-B and ViT-L at their width, every other field as written: 2 of their
        # 12 or 24 blocks do for two steps on a CPU (the full depth took 10-17 s a config,
        # mostly writing its gigabyte of checkpoint)
        if "_r50_" in backbone["name"]:
            # R50+ViT-B: the ResNet stem as written, then 2 blocks 64 wide (the stem projects to any
            # width): at 768 the two hybrid recipes took 15-20 s each on 2 cores, a third of this file
            args.append("--model.init_args.backbone.model_args={depth: 2, embed_dim: 64, num_heads: 2}")
        else:
            args.append("--model.init_args.backbone.model_args={depth: 2}")
    if config.name.startswith("pretrain_") and "MaskedAutoencoder" in str(cfg["model"]["init_args"]["objective"]):
        args.append("--model.init_args.objective.init_args.decoder_depth=1")  # MAE's 8-block decoder
    if (
        "teacher" in cfg["model"]["init_args"]
    ):  # a distillation's teacher file (another demo's checkpoint): random weights
        teacher = cfg["model"]["init_args"]["teacher"]
        (tmp_path / teacher["checkpoint"]).parent.mkdir(parents=True, exist_ok=True)
        encoder = create_backbone(teacher["name"], model_args=teacher.get("model_args"))
        torch.save(encoder.state_dict(), tmp_path / teacher["checkpoint"])
    if config.name.startswith("eomt_"):  # ViT-L: a narrow 4-block one has its 4 joined blocks
        args.append("--model.init_args.backbone.model_args={patch_size: 16, depth: 4, embed_dim: 64, num_heads: 2}")
        args.append("--trainer.check_val_every_n_epoch=null")  # the fake sets hold one batch an epoch
        args.append(
            "--model.init_args.criterion={class_path: vitdense.losses.MaskSetCriterion, init_args: {num_points: 256}}"
        )
    if cfg["model"]["init_args"].get("head", {}).get("init_args", {}).get("stage_maps"):
        args.append("--model.init_args.head.init_args.hooks=[0, 1, 0, 1]")  # DPT-Hybrid's stages, then 2 blocks
    if cfg["model"]["init_args"].get("head", {}).get("class_path", "").endswith("LWDETRHead"):
        args.append("--model.init_args.head.init_args.num_queries=8")  # two-stage picks from the 64 px images' tokens
    if config.name == "pose_coco.yaml":  # its ViT-S: 3 of 12 blocks (its windows and patch size as written)
        args.append(
            "--model.init_args.backbone.model_args={patch_size: 12, depth: 3, num_windows: 2, global_attn_indexes: [2]}"
        )
        args.append("--model.init_args.head.init_args.neck.init_args.feature_indexes=[0, 2]")
    args += [
        "--model.init_args.backbone.pretrained=false",  # offline: same architecture, random weights
        "--trainer.accelerator=cpu",
        "--trainer.devices=1",
        "--trainer.strategy=auto",
        # the GPU recipes' bf16-mixed is emulated, ~100x slower, on CPUs without bf16 (AVX2 only)
        "--trainer.precision=auto",
        "--trainer.max_steps=2",
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.val_check_interval=2",  # validate at the end of the 2 steps, whatever the recipe says
        "--trainer.num_sanity_val_steps=0",
        "--trainer.enable_progress_bar=false",
    ]
    cli = main(args)
    assert cli.trainer.global_step == 2
    if not isinstance(cli.model, (MaskedImageModelingTask, FeatureDistillationTask)):  # pre-training reads no labels
        assert cli.model.num_classes == cli.datamodule.num_classes
    assert cli.model.backbone.img_size == (64, 64)  # linked from the data
    assert cli.model.monitor in cli.trainer.callback_metrics
    assert (tmp_path / cfg["trainer"]["default_root_dir"] / "checkpoints" / "last.ckpt").exists()


def test_ade20k_recipe_tests_on_validation_with_test_windows(tmp_path, monkeypatch):
    """`python -m vitdense test` on the ADE20K config scores the validation split in Segmenter's windows."""
    monkeypatch.chdir(tmp_path)
    config = Path(__file__).parents[1] / "configs" / "seg_ade20k.yaml"
    cfg = yaml.safe_load(config.read_text())
    args = ["test", "--config", str(config), *fake_data_args(config.name, cfg["data"], tmp_path, monkeypatch)]
    args += ["--model.init_args.backbone.pretrained=false", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    args += ["--trainer.precision=auto"]  # (not the emulated bf16 of CPUs without it)
    args += ["--trainer.enable_progress_bar=false"]
    args += ["--model.init_args.backbone.model_args={depth: 2}"]  # 2 of ViT-B's 12 blocks, as in the fit above
    cli = main(args)
    assert cli.model.test_stride == cli.model.window == 64  # the crop, stride = window: Segmenter's 512/512
    assert len(cli.datamodule.test_dataset) == 3
    assert 0 <= cli.trainer.callback_metrics["test/mIoU"] <= 1


@pytest.mark.parametrize("name", ["det_coco.yaml", "det_coco_rfdetr.yaml"])
def test_coco_recipe_tests_and_predicts_on_the_coco_layout(tmp_path, monkeypatch, name):
    """`test` and `predict` on the COCO configs: AP on val2017, and a results JSON with COCO's
    ids whose AP by pycocotools' COCOeval is the AP `test` reported."""
    import json

    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    monkeypatch.chdir(tmp_path)
    config = Path(__file__).parents[1] / "configs" / name
    cfg = yaml.safe_load(config.read_text())
    args = [*fake_data_args(config.name, cfg["data"], tmp_path, monkeypatch), "--data.init_args.img_size=64"]
    args += ["--model.init_args.backbone.pretrained=false", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    args += ["--trainer.precision=auto"]  # (not the emulated bf16 of CPUs without it)
    args += ["--trainer.strategy=auto", "--trainer.enable_progress_bar=false", "--seed_everything=3"]
    if "rfdetr" in name:  # 8 queries from the 64 px images' 25 tokens; the blocks its projector reads
        args += ["--model.init_args.head.init_args.num_queries=8"]
        args += ["--model.init_args.backbone.model_args={depth: 3, num_windows: 2, global_attn_indexes: [2]}"]
        args += ["--model.init_args.head.init_args.neck.init_args.feature_indexes=[0, 2]"]
    else:
        args += ["--model.init_args.backbone.model_args={depth: 2}"]
    out = tmp_path / "dets.json"
    writer = [
        "--trainer.callbacks+=vitdense.training.callbacks.COCOResultsWriter",
        f"--trainer.callbacks.output_file={out}",
    ]
    main(["predict", "--config", str(config), *args, *writer])
    results = json.loads(out.read_text())
    truth_path = tmp_path / "coco" / "annotations" / "instances_val2017.json"
    truth = json.loads(truth_path.read_text())
    assert {r["image_id"] for r in results} == {i["id"] for i in truth["images"]}
    assert {r["category_id"] for r in results} <= {c["id"] for c in truth["categories"]}
    # an untrained model finds nothing of the real objects (AP 0 = 0 would prove little): make
    # the ground truth some of its own detections, moved, so that some match and some miss
    annotations = []
    for image in truth["images"]:
        found = sorted((r for r in results if r["image_id"] == image["id"]), key=lambda r: -r["score"])
        for k, r in enumerate(found[:3]):
            x, y, w, h = r["bbox"]
            box = [x + 0.1 * w * k, y, w, h]  # exact, 10 % off, 20 % off
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": r["category_id"],
                    "bbox": box,
                    "area": w * h,
                    "iscrowd": 0,
                }
            )
    truth_path.write_text(json.dumps({**truth, "annotations": annotations}))
    tested = main(["test", "--config", str(config), *args])
    assert len(tested.datamodule.test_dataset) == 4
    reported = float(tested.trainer.callback_metrics["test/map"])
    coco = COCO(str(truth_path))
    evaluation = COCOeval(coco, coco.loadRes(str(out)), "bbox")
    evaluation.evaluate(), evaluation.accumulate(), evaluation.summarize()
    assert 0.1 < reported < 1
    assert evaluation.stats[0] == pytest.approx(reported, abs=1e-6)


def test_fsdp_recipe_parses_and_wraps_every_transformer_block(capsys):
    """Lightning runs FSDP on GPUs only; on the CPU: the YAML parses into Lightning's
    FSDPStrategy, and its policies select every transformer block of the task's model (the
    ViT-L's 24 and the decoder's 2) and nothing else."""
    from jsonargparse import ArgumentParser
    from lightning.pytorch.strategies import FSDPStrategy, Strategy

    from vitdense.backbone import Block
    from vitdense.tasks import BackboneConfig, SegmentationTask

    config = CONFIGS[0].parent / "seg_ade20k_large_fsdp.yaml"
    with pytest.raises(SystemExit) as exit_info:
        main(["fit", "--config", str(config), "--print_config"])
    assert exit_info.value.code == 0
    printed = yaml.safe_load(capsys.readouterr().out)["trainer"]["strategy"]
    assert printed["class_path"] == "lightning.pytorch.strategies.FSDPStrategy"
    assert printed["init_args"]["auto_wrap_policy"] == ["vitdense.backbone.Block"]
    # instantiated from the YAML as the CLI does (jsonargparse), without a GPU trainer around it
    parser = ArgumentParser()
    parser.add_argument("--strategy", type=Strategy)
    parsed = parser.parse_object({"strategy": printed})
    strategy = getattr(parser, "instantiate", parser.instantiate_classes)(parsed).strategy
    assert isinstance(strategy, FSDPStrategy)
    cfg = yaml.safe_load(config.read_text())["model"]["init_args"]
    task = SegmentationTask(num_classes=150, backbone=BackboneConfig(name=cfg["backbone"]["name"], img_size=64))
    # both policies are torch's ModuleWrapPolicy, which selects the modules of its classes
    wrap, checkpoint = (
        strategy.kwargs["auto_wrap_policy"],
        strategy._activation_checkpointing_kwargs["auto_wrap_policy"],
    )
    for policy in (wrap, checkpoint):
        chosen = [m for m in task.model.modules() if isinstance(m, tuple(policy._module_classes))]
        assert len(chosen) == 24 + 2 and all(isinstance(m, Block) for m in chosen)
