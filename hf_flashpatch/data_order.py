"""The order a training run reads its data in: a pure function of ``(seed, epoch)``, so a resumed run reads
the batches an uninterrupted one would (:mod:`hf_flashpatch.training` skips the ones a checkpoint consumed).

The loaders draw nothing from the global random generator: each has its own (:func:`own_generator`), since
creating an iterator draws a seed from it, and a run resumed mid-epoch creates its iterator at another moment
of the global random stream than an uninterrupted run does (dropout would then differ after a resume).
"""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Sampler

from . import text_data


class EpochShuffleSampler(Sampler):
    """Indices ``0..n-1`` in an order fixed by ``(seed, epoch)``: a resumed run replays the same order."""

    def __init__(self, num_items: int, seed: int, shuffle: bool = True):
        self.num_items, self.seed, self.shuffle, self.epoch = num_items, seed, shuffle, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self):
        return self.num_items

    def __iter__(self):
        if not self.shuffle:
            return iter(range(self.num_items))
        generator = torch.Generator().manual_seed(self.seed * 100_003 + self.epoch)
        return iter(torch.randperm(self.num_items, generator=generator).tolist())


class PackBatchSampler(Sampler):
    """Batches that are whole packs of documents (see ``text_data.flattening_batches``), pack order shuffled."""

    def __init__(self, packs: list[list[int]], seed: int):
        self.packs, self.order = packs, EpochShuffleSampler(len(packs), seed)
        self.batch_size = 1  # accelerate shards batch samplers; one pack is one batch
        self.drop_last = False

    def set_epoch(self, epoch: int) -> None:
        self.order.set_epoch(epoch)

    def __len__(self):
        return len(self.packs)

    def __iter__(self):
        return (self.packs[i] for i in self.order)


def stack_rows(rows):
    """Fixed-length rows as one batch: ``input_ids`` ``(B, S)`` and the same as ``labels``."""
    input_ids = torch.tensor([row["input_ids"] for row in rows], dtype=torch.long)  # (B, S)
    return {"input_ids": input_ids, "labels": input_ids.clone()}


def own_generator(seed: int) -> torch.Generator:
    """A loader's own generator: creating an iterator draws a seed from it, which from the global generator would
    shift the dropout masks of a run resumed mid-epoch (its iterator is made after the RNG state is restored,
    an uninterrupted run's before)."""
    return torch.Generator().manual_seed(seed)


def make_train_loader(args, train) -> tuple[DataLoader, Sampler]:
    """The training loader of ``args.packing`` and the sampler whose epoch the loop sets."""
    if args.packing == "fixed":
        sampler = EpochShuffleSampler(len(train), args.seed)
        return DataLoader(train, batch_size=args.batch_size, sampler=sampler, collate_fn=stack_rows,
                          drop_last=True, generator=own_generator(args.seed)), sampler
    from transformers import DataCollatorWithFlattening

    packs = text_data.flattening_batches([len(ids) for ids in train["input_ids"]], args.seq_len)
    batch_sampler = PackBatchSampler(packs, args.seed)
    collator = DataCollatorWithFlattening(return_flash_attn_kwargs=True, return_position_ids=True)
    return DataLoader(train, batch_sampler=batch_sampler, collate_fn=collator,
                      generator=own_generator(args.seed)), batch_sampler
