"""Image encoding as engine steps, between admission and prefill.

Each engine step computes the vision features of at most one image per sequence here
(images already in the model's feature cache under the sequence's cache salt come free). So a
request with many images holds the engine loop for one image at a time, and one whose client
has gone away is dropped at the next step boundary with its remaining images never encoded.
Only images with placeholders past the sequence's cached prefix are encoded: an image whose
tokens' KV came from the prefix cache is never looked at again. Sequences whose needed images
are all encoded go on to prefill with their features; the others never enter this stage.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from .model import ChatModel
from .prefix import salted
from .sequence import Sequence


class ImageEncoding:
    def __init__(self, model: ChatModel):
        self.model = model
        self.seqs: list[Sequence] = []  # admitted, some image features still to compute
        self._features: dict[int, dict[int, torch.Tensor]] = {}  # seq id -> image index -> features

    def __len__(self) -> int:
        return len(self.seqs)

    @staticmethod
    def needs(seq: Sequence) -> bool:
        return any(span.stop > seq.computed for span in seq.prompt.image_spans)

    def add(self, seq: Sequence) -> None:
        self.seqs.append(seq)
        self._features[seq.id] = {}

    def discard(self, seqs: list[Sequence]) -> None:
        gone = {s.id for s in seqs}
        self.seqs = [s for s in self.seqs if s.id not in gone]
        for seq_id in gone:
            self._features.pop(seq_id, None)

    def step(self) -> tuple[list[tuple[Sequence, dict[int, torch.Tensor]]], list[tuple[Sequence, Exception]]]:
        """Encode the next needed image of each sequence that is not in the feature cache:
        (the sequences now encoded, with their features by image index), (the sequences that
        failed, with why)."""
        done, failed = [], []
        for seq in self.seqs:
            features = self._features[seq.id]
            needed = [i for i, span in enumerate(seq.prompt.image_spans) if span.stop > seq.computed]
            try:
                for i in needed:
                    if i in features:
                        continue
                    # Cached under the sequence's salt, as its prefix blocks are: another tenant's
                    # copy of the same picture goes through the vision encoder again.
                    image = seq.prompt.images[i]
                    image = replace(image, digest=salted(image.digest, seq.params.cache_salt))
                    cached = self.model.has_features(image)
                    features[i] = self.model.image_features(image)
                    if not cached:
                        break
            except Exception as exc:  # e.g. an image the vision tower cannot take: this sequence fails alone
                failed.append((seq, exc))
                continue
            if len(features) == len(needed):
                done.append((seq, features))
        self.discard([seq for seq, _ in done] + [seq for seq, _ in failed])
        return done, failed
