"""Image encoding as engine steps, between admission and prefill.

Each engine step computes the vision features of at most one image per sequence here
(images already in the model's feature cache come free). So a request with many images
holds the engine loop for one image at a time, and one whose client has gone away is
dropped at the next step boundary with its remaining images never encoded. Sequences
whose images are all encoded go on to prefill with their features; text-only prompts
never enter this stage.
"""

from __future__ import annotations

import torch

from .model import ChatModel
from .sequence import Sequence


class ImageEncoding:
    def __init__(self, model: ChatModel):
        self.model = model
        self.seqs: list[Sequence] = []  # admitted, some image features still to compute
        self._features: dict[int, list[torch.Tensor]] = {}  # seq id -> features of its first images

    def __len__(self) -> int:
        return len(self.seqs)

    def add(self, seq: Sequence) -> None:
        self.seqs.append(seq)
        self._features[seq.id] = []

    def discard(self, seqs: list[Sequence]) -> None:
        gone = {s.id for s in seqs}
        self.seqs = [s for s in self.seqs if s.id not in gone]
        for seq_id in gone:
            self._features.pop(seq_id, None)

    def step(self) -> tuple[list[tuple[Sequence, list[torch.Tensor]]], list[tuple[Sequence, Exception]]]:
        """Encode the next uncached image of each sequence: (the sequences now fully encoded,
        with their features in image order), (the sequences that failed, with why)."""
        done, failed = [], []
        for seq in self.seqs:
            features, images = self._features[seq.id], seq.prompt.images
            try:
                while len(features) < len(images):
                    image = images[len(features)]
                    cached = self.model.has_features(image)
                    features.append(self.model.image_features(image))
                    if not cached:
                        break
            except Exception as exc:  # e.g. an image the vision tower cannot take: this sequence fails alone
                failed.append((seq, exc))
                continue
            if len(features) == len(images):
                done.append((seq, features))
        self.discard([seq for seq, _ in done] + [seq for seq, _ in failed])
        return done, failed
