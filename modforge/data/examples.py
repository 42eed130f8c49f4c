"""Base datamodule for datasets held as a list of encoded examples (classification, parallel text)."""
from typing import Callable, Optional

import lightning as L
from torch.utils.data import DataLoader

from modforge.data.tokenizers import Tokenizer


class ExamplesData(L.LightningDataModule):
    """Subclasses fill ``train_set``/``val_set`` and the tokenizer in :meth:`prepare`, and name their ``collate``."""

    collate: Callable

    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.tokenizer: Optional[Tokenizer] = None
        self.train_set: list = []
        self.val_set: list = []
        self.stats: dict = {}

    def prepare(self, tokenizer: Optional[Tokenizer] = None) -> Tokenizer:
        raise NotImplementedError

    def setup(self, stage: Optional[str] = None) -> None:
        self.prepare()

    def _loader(self, examples: list, train: bool) -> DataLoader:
        c = self.cfg
        return DataLoader(examples, batch_size=c.batch_size, shuffle=train, collate_fn=type(self).collate,
                          num_workers=c.num_workers, persistent_workers=train and c.num_workers > 0)

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.train_set, True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set, False)
