"""The model layer of the LLM path: a transformers checkpoint behind a few calls.

`encode` turns chat messages (and their images) into prompt token ids with the model's
own processor and chat template, and finds each image's placeholder span; `image_features`
runs the vision encoder + projector for an image it has not seen (features are cached by
content hash, and text-only prompts never touch the encoder); `embed` gives token
embeddings; `forward` runs the decoder over one engine step's row of tokens, its attention
reading and writing the paged KV cache (paged_attention.py), and returns the logits where the
caller asks.

Vision-language checkpoints load with `AutoModelForImageTextToText` + `AutoProcessor`
(LLaVA-1.5, LLaVA-NeXT and other models whose image features replace placeholder
tokens one for one); text-only ones with `AutoModelForCausalLM` + `AutoTokenizer`.
Qwen2-VL and Qwen2.5-VL also place tokens with multimodal rotary positions (M-RoPE):
`encode` computes each image prompt's (3, len) positions with the model's own
`get_rope_index`, and the engine passes them (and, for generated tokens, their index plus the
prompt's `rope_delta`) explicitly.
"""

from __future__ import annotations

import inspect
import tempfile
import threading
from collections import OrderedDict

import torch
from PIL import Image
from transformers import (
    AutoModelForCausalLM,
    AutoModelForImageTextToText,
    AutoProcessor,
    AutoTokenizer,
    Qwen2_5_VLProcessor,
    Qwen2VLProcessor,
)

from vidserve.chat import ChatImage
from vidserve.errors import InvalidRequest
from vidserve.registry import ChatModelSpec

from ..devices import placement
from ..fetch import fetching
from . import paged_attention
from .kv_cache import KVShape
from .prefix import ImageSpan
from .prompt import Prompt
from .tiny import build_tiny_vlm
from .vision_size import processed_size


def _without_video(processor_class):
    """The processor minus its video processor, which transformers requires for Qwen2-VL's
    processors and which needs torchvision (not a dependency). The engine takes images only."""
    class ImagesOnly(processor_class):
        def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
            super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

    ImagesOnly.__name__ = ImagesOnly.__qualname__ = f"{processor_class.__name__}ImagesOnly"
    return ImagesOnly


# model_type -> the processor the engine loads for it: the M-RoPE models it supports.
MROPE_PROCESSORS = {"qwen2_vl": _without_video(Qwen2VLProcessor), "qwen2_5_vl": _without_video(Qwen2_5_VLProcessor)}


class ChatModel:
    def __init__(self, spec: ChatModelSpec, model, processor, device: torch.device, feature_cache_size: int = 64):
        self.spec = spec
        self.model = model
        self.processor = processor  # the model's processor for vision models, the tokenizer otherwise
        self.tokenizer = getattr(processor, "tokenizer", processor)
        self.device = device
        config = model.config
        self.vision = hasattr(config, "vision_config")
        self.image_token_id = getattr(config, "image_token_id", None) or getattr(config, "image_token_index", None)
        self.text_config = text_config = config.get_text_config(decoder=True)
        text_config._attn_implementation = paged_attention.NAME  # the decoder's alone: the vision tower keeps its own
        if "sliding_attention" in (getattr(text_config, "layer_types", None) or []):
            # The batch keeps full caches; a sliding window would silently attend too far.
            raise ValueError(f"{spec.name}: sliding-window attention layers are not supported by the engine yet")
        self.mrope = config.model_type in MROPE_PROCESSORS
        if not self.mrope and hasattr(getattr(model, "model", None), "get_rope_index"):
            # Other M-RoPE families differ (interleaved sections, timestamps, features fed to
            # decoder layers): without their positions they would answer wrongly, not fail.
            raise ValueError(f"{spec.name}: {config.model_type}'s multimodal rotary positions are not supported "
                             "by the engine yet")
        self.vocab_size = text_config.vocab_size
        self.max_context = int(getattr(text_config, "max_position_embeddings", 0) or self.tokenizer.model_max_length)
        eos = model.generation_config.eos_token_id
        eos = [eos] if isinstance(eos, int) else list(eos or [])
        if self.tokenizer.eos_token_id is not None:
            eos.append(self.tokenizer.eos_token_id)
        self.eos_ids = frozenset(eos)
        self._features: OrderedDict[str, torch.Tensor] = OrderedDict()
        self._feature_cache_size = feature_cache_size
        self._lock = threading.Lock()
        self.vision_calls = 0  # images encoded: the feature cache's misses

    @classmethod
    def load(cls, spec: ChatModelSpec, device: str = "auto", dtype: str = "auto") -> "ChatModel":
        torch_device, torch_dtype = placement(device, dtype)
        if spec.builtin:
            # Built-in models take the checkpoint path too, so an exported folder is identical.
            with tempfile.TemporaryDirectory(prefix=f"vidserve-{spec.name}-") as folder:
                model, processor = build_tiny_vlm()
                model.save_pretrained(folder)
                processor.save_pretrained(folder)
                return cls._from_pretrained(spec, folder, torch_device, torch_dtype)
        return cls._from_pretrained(spec, spec.source, torch_device, torch_dtype)

    @classmethod
    def _from_pretrained(cls, spec, source: str, device: torch.device, dtype: torch.dtype) -> "ChatModel":
        with fetching(source):
            if spec.vision:
                model = AutoModelForImageTextToText.from_pretrained(source, dtype=dtype)
                processor_class = MROPE_PROCESSORS.get(model.config.model_type, AutoProcessor)
                processor = processor_class.from_pretrained(source)
            else:
                model = AutoModelForCausalLM.from_pretrained(source, dtype=dtype)
                processor = AutoTokenizer.from_pretrained(source)
        return cls(spec, model.to(device).eval(), processor, device)

    # -- prompts ---------------------------------------------------------------------------

    def encode(self, messages: list[dict], images: list[ChatImage]) -> Prompt:
        """Messages in transformers' chat shape; each {"type": "image"} part takes the next image."""
        if images and not self.vision:
            raise InvalidRequest(f"model {self.spec.name!r} does not accept images", param="messages",
                                 code="images_not_supported")
        if not self.vision:
            messages = [{**m, "content": _text_of(m["content"])} for m in messages]
        try:
            text = self.processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # templates raise on what their model can't take (roles, order)
            raise InvalidRequest(f"the chat template of {self.spec.name!r} rejected the messages: {exc}",
                                 param="messages") from exc
        if not images:
            return Prompt(token_ids=list(self.tokenizer(text, add_special_tokens=False)["input_ids"]))
        encoded = self.processor(text=text, images=[i.image for i in images], add_special_tokens=False,
                                 return_tensors="pt")
        ids = encoded["input_ids"][0].tolist()
        prompt = Prompt(token_ids=ids, images=images, image_spans=self._image_spans(ids, images))
        if self.mrope:
            positions, delta = self.model.model.get_rope_index(
                encoded["input_ids"], mm_token_type_ids=encoded["mm_token_type_ids"],
                image_grid_thw=encoded["image_grid_thw"])
            prompt.positions, prompt.rope_delta = positions[:, 0], int(delta)
        return prompt

    def check_image(self, image: Image.Image, max_pixels: int) -> None:
        """Refuse an image that this model's processor would scale past `max_pixels`
        (width*height), before the processor runs."""
        image_processor = getattr(self.processor, "image_processor", None)
        if image_processor is None:
            return  # a text-only model: `encode` refuses its images
        try:
            size = processed_size(image_processor, image.width, image.height)
        except ValueError as exc:  # the processor's own refusal, e.g. Qwen2-VL's aspect ratio limit
            raise InvalidRequest(f"{self.spec.name} cannot take a {image.width}x{image.height} image: {exc}",
                                 code="invalid_image") from None
        if size is not None and size[0] * size[1] > max_pixels:
            raise InvalidRequest(
                f"the image is {image.width}x{image.height}; {self.spec.name}'s processor would scale it to "
                f"{size[0]}x{size[1]} = {size[0] * size[1]} pixels, and the limit is {max_pixels} "
                "(VIDSERVE_CHAT_MAX_VISION_PIXELS): send a smaller or less elongated image", code="image_too_large")

    @property
    def kv_shape(self) -> KVShape:
        return KVShape.of(self.text_config, self.model.dtype)

    def rope_positions(self, prompt: Prompt) -> torch.Tensor:
        """[3, tokens] M-RoPE positions of a prompt, on the model's device."""
        if prompt.positions is None:
            return torch.arange(len(prompt.token_ids), device=self.device).expand(3, -1)
        return prompt.positions.to(self.device)

    def _image_spans(self, ids: list[int], images: list[ChatImage]) -> list[ImageSpan]:
        """Which placeholders are whose: each image's are one run, in image order. Runs that
        touch (two images with nothing between) are split evenly, as models whose images all
        take the same number of tokens fill them."""
        places = [i for i, token in enumerate(ids) if token == self.image_token_id]
        runs = [[places[0]]] if places else []
        for place in places[1:]:
            if place == runs[-1][-1] + 1:
                runs[-1].append(place)
            else:
                runs.append([place])
        if len(runs) != len(images) and places and len(places) % len(images) == 0:
            size = len(places) // len(images)
            runs = [places[i:i + size] for i in range(0, len(places), size)]
        if len(runs) != len(images) or any(run[-1] - run[0] + 1 != len(run) for run in runs):
            raise InvalidRequest(f"{len(images)} images gave {len(runs)} runs of image tokens in the prompt; "
                                 "put some text between the images", param="messages")
        return [ImageSpan(run[0], run[-1] + 1, image.digest) for run, image in zip(runs, images)]

    def has_features(self, image: ChatImage) -> bool:
        """Whether `image_features` would come from the cache, without the vision encoder."""
        with self._lock:
            return image.digest in self._features

    @torch.inference_mode()
    def image_features(self, image: ChatImage) -> torch.Tensor:
        """[image tokens, hidden]: one image through the processor, vision encoder and projector, or from the cache."""
        with self._lock:
            if image.digest in self._features:
                self._features.move_to_end(image.digest)
                return self._features[image.digest]
        pixels = self.processor.image_processor(images=[image.image], return_tensors="pt")
        accepted = inspect.signature(self.model.get_image_features).parameters
        kwargs = {k: v.to(self.device) for k, v in pixels.items() if k in accepted}
        kwargs["pixel_values"] = kwargs["pixel_values"].to(self.model.dtype)
        out = self.model.get_image_features(**kwargs)
        features = getattr(out, "pooler_output", out)
        features = torch.cat(list(features)) if isinstance(features, (list, tuple)) else features.flatten(0, -2)
        with self._lock:
            self.vision_calls += 1
            self._features[image.digest] = features
            while len(self._features) > self._feature_cache_size:
                self._features.popitem(last=False)
        return features

    # -- decoding ---------------------------------------------------------------------------

    @torch.inference_mode()
    def embed(self, token_ids: list[int]) -> torch.Tensor:
        """[tokens, hidden] token embeddings."""
        return self.model.get_input_embeddings()(torch.tensor(token_ids, device=self.device))

    @torch.inference_mode()
    def forward(self, inputs_embeds: torch.Tensor, position_ids: torch.Tensor, step: paged_attention.PagedStep,
                logits_at: torch.Tensor) -> torch.Tensor:
        """Logits [n, vocab] at the n columns `logits_at` (ascending) of one row of tokens.

        `inputs_embeds` is [1, tokens, hidden]; `position_ids` [1, tokens], or [3, 1, tokens]
        for M-RoPE models: given explicitly, Qwen2-VL never falls back on the `rope_deltas` it
        keeps from its last call. The attention reads and writes the KV cache as `step` says;
        the 4D placeholder mask only stops transformers from building a mask nobody reads."""
        out = self.model(inputs_embeds=inputs_embeds, position_ids=position_ids, attention_mask=_NO_MASK,
                         use_cache=False, logits_to_keep=logits_at, paged_step=step)
        return out.logits[0].float()


_NO_MASK = torch.ones(1, 1, 1, 1, dtype=torch.bool)


def _text_of(content) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)
