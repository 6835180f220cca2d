"""Labelled images for the classifiers: an image folder or WebDataset-style tar shards,
read from disk or S3, decoded (Pillow) and augmented in the DataLoader's workers.

`data.path` holds two splits, `train/` (trained on) and `val/` (held out, for accuracy):

    image_folder:  <path>/train/<class name>/<any name>.jpg   (.jpeg .png .webp .bmp)
                   <path>/val/<class name>/...                (class names as in train/)
    image_shards:  <path>/train/<shard>.tar, <path>/val/<shard>.tar; in each shard a sample
                   is the files sharing a key (the name up to the basename's first dot,
                   WebDataset's rule): the image <key>.jpg and its label <key>.cls (an
                   integer as text). <path> may be s3://bucket/prefix.

Every sample is indexed up front (a shard's member offsets, read once), so the dataset is
indexable and the trainer's sampler gives the exact sample order after a resume. Random
augmentation is drawn from a generator seeded by (run.seed, epoch, index): a sample looks
the same in a resumed run, whichever worker decodes it.
"""

from __future__ import annotations

import io
import math
import os
import tarfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import boto3
import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
SPLITS = ("train", "val")
# ImageNet's channel statistics, the usual normalisation for ResNets.
MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
# Evaluation resizes the short side to image_size / 0.875, then takes the centre crop
# (224 from 256, as in the ResNet paper's evaluation).
_EVAL_CROP_FRACTION = 0.875


@dataclass(frozen=True)
class Sample:
    """Where one image's bytes are (a file, or a byte range of a shard) and its label."""

    location: str
    label: int
    offset: int = 0
    size: int = -1  # -1: the whole file


class FileReader:
    def read(self, sample: Sample) -> bytes:
        with open(sample.location, "rb") as file:
            file.seek(sample.offset)
            return file.read(sample.size)


class S3Reader:
    """Byte ranges of shard objects, one client per process (DataLoader workers included):
    boto3 clients are not to be shared across a fork."""

    def __init__(self, bucket: str):
        self.bucket = bucket
        self._client = None
        self._pid = None

    def client(self):
        if self._pid != os.getpid():
            self._client, self._pid = boto3.client("s3"), os.getpid()
        return self._client

    def read(self, sample: Sample) -> bytes:
        # GetObject's Range is inclusive at both ends, bytes=first-last
        # (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html).
        last = sample.offset + sample.size - 1
        response = self.client().get_object(
            Bucket=self.bucket, Key=sample.location, Range=f"bytes={sample.offset}-{last}"
        )
        return response["Body"].read()

    def __getstate__(self) -> dict:
        return {"bucket": self.bucket, "_client": None, "_pid": None}


class LabelledImages(Dataset):
    """Items are (image, label): a float32 CHW tensor of image_size², normalised, and a
    LongTensor scalar. `train` augments (random resized crop, horizontal flip)."""

    def __init__(
        self,
        samples: list[Sample],
        reader: FileReader | S3Reader,
        *,
        image_size: int,
        train: bool,
        seed: int,
    ):
        self.samples, self.reader = samples, reader
        self.image_size, self.train, self.seed = image_size, train, seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Called by the trainer before each epoch: new crops and flips every epoch."""
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        sample = self.samples[index]
        try:
            image = Image.open(io.BytesIO(self.reader.read(sample))).convert("RGB")
        except OSError as error:
            raise ValueError(f"cannot decode the image at {sample.location}: {error}") from None
        if self.train:
            rng = np.random.default_rng((self.seed, self.epoch, index))
            image = random_resized_crop(image, self.image_size, rng)
            if rng.random() < 0.5:
                image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        else:
            image = center_crop(image, self.image_size)
        pixels = torch.from_numpy(np.asarray(image, dtype=np.uint8).copy())
        tensor = pixels.permute(2, 0, 1).float().div_(255)
        return (tensor - MEAN) / STD, torch.tensor(sample.label)


def random_resized_crop(
    image: Image.Image, size: int, rng: np.random.Generator, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)
) -> Image.Image:
    """Inception-style crop (Szegedy et al. 2014): a random area fraction in `scale` and
    aspect ratio in `ratio` (log-uniform), resized to size²; after 10 misses the centre."""
    width, height = image.size
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(ratio[0]), math.log(ratio[1])))
        w = round(math.sqrt(target * aspect))
        h = round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left = int(rng.integers(0, width - w + 1))
            top = int(rng.integers(0, height - h + 1))
            return image.resize(
                (size, size), Image.Resampling.BILINEAR, (left, top, left + w, top + h)
            )
    return center_crop(image, size)


def center_crop(image: Image.Image, size: int) -> Image.Image:
    """The short side scaled to size / 0.875, then the central size² square."""
    width, height = image.size
    scale = size / _EVAL_CROP_FRACTION / min(width, height)
    resized = image.resize(
        (max(size, round(width * scale)), max(size, round(height * scale))),
        Image.Resampling.BILINEAR,
    )
    left = (resized.width - size) // 2
    top = (resized.height - size) // 2
    return resized.crop((left, top, left + size, top + size))


# ------------------------------------------------------------------------- indexing


def folder_samples(split_dir: Path, classes: list[str] | None) -> tuple[list[Sample], list[str]]:
    """Every image under split_dir/<class>/, sorted; labels follow `classes` (train's)."""
    if not split_dir.is_dir():
        raise ValueError(f"{split_dir} is not a directory: expected <class>/<image> files in it")
    found = sorted(entry.name for entry in split_dir.iterdir() if entry.is_dir())
    classes = found if classes is None else classes
    unknown = sorted(set(found) - set(classes))
    if unknown:
        raise ValueError(
            f"{split_dir} has class folder {unknown[0]!r}, which train/ lacks: "
            "use the same class names in both splits"
        )
    samples = [
        Sample(str(file), classes.index(name))
        for name in found
        for file in sorted((split_dir / name).rglob("*"))
        if file.suffix.lower() in IMAGE_EXTENSIONS
    ]
    if not samples:
        raise ValueError(f"{split_dir} holds no images ({', '.join(IMAGE_EXTENSIONS)})")
    return samples, classes


def shard_samples(members: Callable[[], tuple], location: str) -> list[Sample]:
    """The samples of one tar shard, from its members as (TarInfo, read-the-member-bytes)."""
    images: dict[str, tarfile.TarInfo] = {}
    labels: dict[str, int] = {}
    for member, read in members():
        if not member.isfile():
            continue
        directory, _, base = member.name.rpartition("/")
        stem, _, extension = base.partition(".")
        key = f"{directory}/{stem}"
        if f".{extension.lower()}" in IMAGE_EXTENSIONS:
            images[key] = member
        elif extension == "cls":
            text = read().decode().strip()
            try:
                labels[key] = int(text)
            except ValueError:
                raise ValueError(
                    f"{location}: {member.name} holds {text!r}, not an integer label"
                ) from None
    missing = sorted(set(images) - set(labels))
    if missing:
        raise ValueError(f"{location}: sample {missing[0]!r} has an image but no .cls label")
    return [
        Sample(location, labels[key], offset=member.offset_data, size=member.size)
        for key, member in sorted(images.items(), key=lambda item: item[1].offset_data)
    ]


def local_shards(split_dir: Path) -> list[Sample]:
    shards = sorted(split_dir.glob("*.tar")) if split_dir.is_dir() else []
    if not shards:
        raise ValueError(f"{split_dir} holds no .tar shards")
    samples = []
    for shard in shards:

        def members(shard=shard):
            with tarfile.open(shard) as tar:  # seeks from header to header
                for member in tar:
                    yield member, lambda member=member: tar.extractfile(member).read()

        samples += shard_samples(members, str(shard))
    return samples


def s3_shards(bucket: str, prefix: str, reader: S3Reader) -> list[Sample]:
    client = reader.client()
    keys = sorted(
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
        for item in page.get("Contents", [])
        if item["Key"].endswith(".tar")
    )
    if not keys:
        raise ValueError(f"s3://{bucket}/{prefix} holds no .tar shards")
    samples = []
    for key in keys:

        def members(key=key):
            body = client.get_object(Bucket=bucket, Key=key)["Body"]
            # Stream mode: one pass over the object, member by member.
            with tarfile.open(fileobj=body, mode="r|") as tar:
                for member in tar:
                    yield member, lambda member=member: tar.extractfile(member).read()

        samples += shard_samples(members, key)
    return samples


def image_datasets(
    kind: str, path: str, *, image_size: int, num_classes: int, seed: int
) -> tuple[LabelledImages, LabelledImages]:
    """(train, val) datasets of `path`; ValueError with a one-line reason when unusable."""
    splits: dict[str, list[Sample]] = {}
    reader: FileReader | S3Reader
    if path.startswith("s3://"):
        bucket, _, prefix = path.removeprefix("s3://").partition("/")
        reader = S3Reader(bucket)
        for split in SPLITS:
            splits[split] = s3_shards(
                bucket, "/".join(filter(None, (prefix.strip("/"), split, ""))), reader
            )
    else:
        reader, root = FileReader(), Path(path)
        if kind == "image_folder":
            splits["train"], classes = folder_samples(root / "train", None)
            splits["val"], _ = folder_samples(root / "val", classes)
            if len(classes) != num_classes:
                raise ValueError(
                    f"data.num_classes = {num_classes} but {root / 'train'} has {len(classes)} "
                    "class folders: make them agree"
                )
        else:
            splits = {split: local_shards(root / split) for split in SPLITS}
    for split, samples in splits.items():
        top = max(sample.label for sample in samples)
        if top >= num_classes:
            raise ValueError(
                f"{path} {split}/ has label {top}, outside data.num_classes = {num_classes}: "
                f"set data.num_classes = {top + 1} or more"
            )
    train, val = (
        LabelledImages(
            splits[split], reader, image_size=image_size, train=split == "train", seed=seed
        )
        for split in SPLITS
    )
    return train, val
