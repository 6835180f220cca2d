"""Labelled images from a generated image folder, local tar shards and shards in a real S3
API (moto's server): the same samples in each, augmentation fixed per (epoch, index)."""

from __future__ import annotations

import io
import tarfile
from urllib.parse import urlparse

import boto3
import pytest
import torch
from torch.utils.data import DataLoader

from examples.image_classification.make_images import make_images
from training.image_data import image_datasets
from training.sampler import ResumableDistributedSampler

CLASSES, TRAIN, VAL, SIZE = 4, 24, 8, 32


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    return make_images(tmp_path_factory.mktemp("images"), classes=CLASSES, train=TRAIN, val=VAL)


def datasets(kind: str, path: str):
    return image_datasets(kind, path, image_size=SIZE, num_classes=CLASSES, seed=7)


def upload(folder, s3_uri: str) -> str:
    """The shard folder under the S3 prefix; returns its URI."""
    bucket, prefix = urlparse(s3_uri).netloc, urlparse(s3_uri).path.strip("/")
    client = boto3.client("s3")
    for file in sorted(folder.rglob("*.tar")):
        client.upload_file(str(file), bucket, f"{prefix}/{file.relative_to(folder).as_posix()}")
    return s3_uri


def labels(dataset) -> list[int]:
    return [sample.label for sample in dataset.samples]


def test_folder_and_shards_hold_the_generated_labels(images):
    # make_images labels image n with n % classes; the folder lists class by class.
    folder_train, _ = datasets("image_folder", str(images / "folder"))
    shard_train, shard_val = datasets("image_shards", str(images / "shards"))
    assert labels(shard_train) == [n % CLASSES for n in range(TRAIN)]
    assert labels(shard_val) == [n % CLASSES for n in range(VAL)]
    assert labels(folder_train) == sorted(n % CLASSES for n in range(TRAIN))
    image, label = shard_train[0]
    assert image.shape == (3, SIZE, SIZE) and image.dtype == torch.float32
    assert label.dtype == torch.int64


def test_a_shard_sample_decodes_to_the_same_image_as_its_file(images):
    _, folder_val = datasets("image_folder", str(images / "folder"))
    _, shard_val = datasets("image_shards", str(images / "shards"))
    # Held-out image n = 5 (not augmented) is class_1/00005.jpg, the sixth shard sample.
    folder_index = [s.location.endswith("class_1/00005.jpg") for s in folder_val.samples]
    assert torch.equal(folder_val[folder_index.index(True)][0], shard_val[5][0])


def test_s3_shards_read_like_local_ones(images, s3_uri):
    uri = upload(images / "shards", s3_uri)
    local_train, _ = datasets("image_shards", str(images / "shards"))
    remote_train, remote_val = datasets("image_shards", uri)
    assert labels(remote_train) == labels(local_train)
    assert len(remote_val) == VAL
    for index in (0, 7, TRAIN - 1):
        assert torch.equal(remote_train[index][0], local_train[index][0])
    # Read in DataLoader workers (each opens its own client), the same batches.
    loader = DataLoader(remote_train, batch_size=6, num_workers=2)
    first = next(iter(loader))[0]
    assert torch.equal(first, torch.stack([local_train[i][0] for i in range(6)]))


def test_augmentation_is_fixed_per_epoch_and_index_whatever_the_worker(images):
    train, val = datasets("image_folder", str(images / "folder"))
    epoch_0 = train[3][0]
    train.set_epoch(1)
    assert not torch.equal(train[3][0], epoch_0)  # a new crop each epoch
    train.set_epoch(0)
    loaded = torch.cat([batch for batch, _ in DataLoader(train, batch_size=4, num_workers=2)])
    assert torch.equal(loaded[3], epoch_0)
    assert torch.equal(val[2][0], val[2][0])  # evaluation does not augment


def test_resumed_sampler_gives_the_same_images(images):
    """Stop after 2 batches of epoch 1, resume from the sampler's state: the rest of the
    epoch is the images an uninterrupted run would have seen."""
    train, _ = datasets("image_shards", str(images / "shards"))

    def run(sampler, batches):
        train.set_epoch(sampler.epoch)
        loader = DataLoader(train, batch_size=3, sampler=sampler, num_workers=2)
        seen = []
        for images_, _ in loader:
            sampler.advance(len(images_))
            seen.append(images_)
            if len(seen) == batches:
                break
        return seen

    whole = ResumableDistributedSampler(TRAIN, rank=1, world_size=2, seed=7)
    whole.next_epoch()
    expected = run(whole, 4)
    first = ResumableDistributedSampler(TRAIN, rank=1, world_size=2, seed=7)
    first.next_epoch()
    got = run(first, 2)
    resumed = ResumableDistributedSampler(TRAIN, rank=1, world_size=2, seed=7)
    resumed.load_state_dict(first.state_dict())
    got += run(resumed, 2)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))


def test_a_label_outside_num_classes_is_one_line(images):
    with pytest.raises(ValueError, match=r"label 3, outside data.num_classes = 3: set data.num"):
        image_datasets(
            "image_shards", str(images / "shards"), image_size=SIZE, num_classes=3, seed=0
        )
    with pytest.raises(ValueError, match=r"data.num_classes = 5 but .* has 4 class folders"):
        image_datasets(
            "image_folder", str(images / "folder"), image_size=SIZE, num_classes=5, seed=0
        )


def test_a_shard_image_without_label_is_named(tmp_path):
    for split in ("train", "val"):
        (tmp_path / split).mkdir()
        with tarfile.open(tmp_path / split / "s.tar", "w") as tar:
            info = tarfile.TarInfo("a/cat.jpg")
            info.size = 3
            tar.addfile(info, io.BytesIO(b"abc"))
    with pytest.raises(ValueError, match=r"sample 'a/cat' has an image but no .cls label"):
        image_datasets("image_shards", str(tmp_path), image_size=SIZE, num_classes=2, seed=0)
