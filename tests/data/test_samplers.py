"""Training order resumable mid-epoch and sharded without overlap; evaluation without repeats."""

import torch

from vitdense.data.samplers import EpochSeededDataset, EvalSampler, TrainSampler
from vitdense.data.transforms.classification import classification_train_transforms


class Numbers(torch.utils.data.Dataset):
    def __len__(self):
        return 21

    def __getitem__(self, index):
        return index


def test_order_is_a_function_of_seed_and_epoch_and_resumes_mid_epoch():
    sampler = TrainSampler(Numbers(), seed=3, num_replicas=1, rank=0)
    sampler.set_epoch(2)
    full = list(sampler)
    assert sorted(i for _, i in full) == list(range(21)) and {e for e, _ in full} == {2}
    again = TrainSampler(Numbers(), seed=3, num_replicas=1, rank=0)
    again.set_epoch(2)
    assert list(again) == full
    again.set_epoch(1)
    assert list(again) != full  # another epoch, another permutation
    resumed = TrainSampler(Numbers(), seed=3, num_replicas=1, rank=0)
    resumed.resume(epoch=2, consumed=8)
    assert list(resumed) == full[8:]
    assert list(resumed) == full  # the skip applies once: the next pass is the whole epoch again


def test_ranks_get_disjoint_equal_shards_of_one_permutation():
    shards = []
    for rank in range(2):
        sampler = TrainSampler(Numbers(), seed=0, num_replicas=2, rank=rank)
        sampler.set_epoch(0)
        shards.append([i for _, i in sampler])
    assert len(shards[0]) == len(shards[1]) == 10  # 21 // 2: the odd sample out is dropped, as drop_last
    assert not set(shards[0]) & set(shards[1])


def test_evaluation_covers_every_sample_once_across_ranks():
    shards = [list(EvalSampler(Numbers(), num_replicas=2, rank=r)) for r in range(2)]
    assert [len(EvalSampler(Numbers(), num_replicas=2, rank=r)) for r in range(2)] == [11, 10]
    assert sorted(shards[0] + shards[1]) == list(range(21))  # torch's sampler would repeat one


class Images(torch.utils.data.Dataset):
    def __init__(self):
        self.transform = classification_train_transforms(16, (0.5,) * 3, (0.5,) * 3)
        self.image = torch.randint(0, 256, (24, 24, 3), dtype=torch.uint8).numpy()

    def __len__(self):
        return 4

    def __getitem__(self, index):
        return self.transform(image=self.image)["image"]


def test_a_samples_augmentation_depends_only_on_seed_epoch_and_index():
    data = EpochSeededDataset(Images(), seed=0)
    first = data[(0, 1)]
    data[(0, 2)], data[(5, 1)]  # other draws in between change nothing
    assert torch.equal(data[(0, 1)], first)
    assert not torch.equal(data[(1, 1)], first)  # the next epoch draws another crop
    assert len(data) == 4 and data.image is data.dataset.image  # attributes reach the dataset


def test_a_position_converts_to_another_layout_by_samples():
    import pytest

    from vitdense.core.errors import ConfigError
    from vitdense.data.samplers import TrainLayout

    # 2 processes x batch 2 after 3 steps: the first 12 samples of the epoch's permutation
    samplers = [TrainSampler(Numbers(), seed=0, num_replicas=2, rank=r) for r in range(2)]
    seen = {i for s in samplers for i in s.order(0)[:6]}
    one = TrainSampler(Numbers(), seed=0, num_replicas=1, rank=0)
    assert seen == set(one.order(0)[:12])
    saved = TrainLayout(batch_size=2, num_replicas=2)
    now = TrainLayout(batch_size=2, num_replicas=1, accumulate=2)
    assert now.resumed_from(saved, epoch=0, batches=3) == 6  # batches of 2 on 1 process
    assert now.global_batch == saved.global_batch == 4
    assert TrainLayout(2, 1).keeping(saved) == "--trainer.accumulate_grad_batches 2 keeps it"
    assert "no accumulate_grad_batches" in TrainLayout(3, 1).keeping(saved)
    with pytest.raises(ConfigError, match=r"12 samples into epoch 0 .* batches of 8 on 1 processes"):
        TrainLayout(batch_size=8, num_replicas=1).resumed_from(saved, epoch=0, batches=3)


def test_a_loader_resumed_in_another_layout_skips_the_samples_and_sets_the_loop(recwarn):
    from types import SimpleNamespace

    from vitdense.data.base import ResumableDataLoader
    from vitdense.data.samplers import resume_position

    def trainer(processed: int, accumulate: int) -> SimpleNamespace:
        current = SimpleNamespace(ready=processed, started=processed, processed=processed, completed=processed - 1)
        loops = SimpleNamespace(
            epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=0)),
            epoch_loop=SimpleNamespace(batch_progress=SimpleNamespace(current=current)),
        )
        return SimpleNamespace(fit_loop=loops, accumulate_grad_batches=accumulate)

    def loader(batch_size: int, replicas: int, rank: int, run: SimpleNamespace) -> ResumableDataLoader:
        sampler = TrainSampler(Numbers(), seed=0, num_replicas=replicas, rank=rank)
        return ResumableDataLoader(
            EpochSeededDataset(Numbers(), 0), batch_size=batch_size, sampler=sampler, trainer=lambda: run
        )

    state = loader(2, 2, 0, trainer(3, 1)).state_dict()  # rank 0 of 2, 3 batches of 2 done
    assert state == {"train_position": [0, 3], "train_layout": {"batch_size": 2, "num_replicas": 2, "accumulate": 1}}
    run = trainer(3, 2)  # Lightning restored the checkpoint's counters
    resumed = loader(2, 1, 0, run)
    resumed.load_state_dict(state)
    assert not recwarn.list  # the same global batch: nothing to say
    assert [int(i) for b in resumed for i in b] == TrainSampler(Numbers(), 0, 1, 0).order(0)[12:]
    assert resume_position(run) == (0, 6)
    assert run.fit_loop.epoch_loop.batch_progress.current.completed == 5  # still one behind, as Lightning wrote it
    # another global batch (4 x 1 x 2 = 8): said, with what keeps it
    loader(4, 1, 0, trainer(3, 2)).load_state_dict(state)
    (warning,) = recwarn.list
    assert "global batch was 4" in str(warning.message)
    assert "--trainer.accumulate_grad_batches 1 keeps it" in str(warning.message)
