"""A dataset that says which process imported its module (tests/training/test_data.py)."""

import os

from torch.utils.data import Dataset

IMPORTED_IN = os.getpid()


class WhereImported(Dataset):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[int, int]:
        return IMPORTED_IN, os.getpid()
