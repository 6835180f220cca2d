"""Write a small labelled image dataset in both layouts `data.kind` reads:

    DIR/folder/{train,val}/class_<k>/<n>.jpg           (data.kind = "image_folder")
    DIR/shards/{train,val}/shard-<m>.tar               (data.kind = "image_shards")

Class k's images are noisy pictures of one colour (its hue is k / classes around the
colour wheel), so a small model learns them in a few dozen steps. Deterministic: the same
arguments write the same bytes.

    python -m examples.image_classification.make_images /tmp/images --classes 4
"""

from __future__ import annotations

import argparse
import colorsys
import io
import tarfile
from pathlib import Path

import numpy as np
from PIL import Image


def image_bytes(label: int, classes: int, rng: np.random.Generator, size: int) -> bytes:
    red, green, blue = colorsys.hsv_to_rgb(label / classes, 0.8, 0.9)
    colour = np.array([red, green, blue]) * 255
    pixels = colour + rng.normal(0, 40, (size, size, 3))
    buffer = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buffer, format="JPEG", quality=90)
    return buffer.getvalue()


def make_images(
    root: Path,
    *,
    classes: int = 4,
    train: int = 64,
    val: int = 32,
    size: int = 40,
    shard_size: int = 16,
) -> Path:
    """Write both layouts under `root`; returns root. `train`/`val`: images per split."""
    rng = np.random.default_rng(0)
    for split, count in (("train", train), ("val", val)):
        labelled = [
            (n, n % classes, image_bytes(n % classes, classes, rng, size)) for n in range(count)
        ]
        for n, label, data in labelled:
            file = root / "folder" / split / f"class_{label}" / f"{n:05d}.jpg"
            file.parent.mkdir(parents=True, exist_ok=True)
            file.write_bytes(data)
        shard_dir = root / "shards" / split
        shard_dir.mkdir(parents=True, exist_ok=True)
        for first in range(0, count, shard_size):
            with tarfile.open(shard_dir / f"shard-{first // shard_size:04d}.tar", "w") as tar:
                for n, label, data in labelled[first : first + shard_size]:
                    for name, payload in (
                        (f"{n:05d}.jpg", data),
                        (f"{n:05d}.cls", str(label).encode()),
                    ):
                        info = tarfile.TarInfo(f"sample/{name}")
                        info.size, info.mtime = len(payload), 0
                        tar.addfile(info, io.BytesIO(payload))
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("root", type=Path)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--train", type=int, default=64, help="training images")
    p.add_argument("--val", type=int, default=32, help="held-out images")
    p.add_argument("--size", type=int, default=40, help="side of each image in pixels")
    args = p.parse_args()
    make_images(args.root, classes=args.classes, train=args.train, val=args.val, size=args.size)
    print(f"wrote {args.root}/folder (image_folder) and {args.root}/shards (image_shards)")


if __name__ == "__main__":
    main()
