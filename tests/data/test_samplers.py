"""Training order resumable mid-epoch and sharded without overlap; evaluation without repeats."""

import torch

from vitdense.data.samplers import EpochSeededDataset, EvalSampler, TrainSampler
from vitdense.data.transforms import classification_train_transforms


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
