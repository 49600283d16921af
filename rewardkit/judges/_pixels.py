"""The vision inputs (``pixel_values``, ``image_grid_thw``) of the transformers judge without transformers' PIL
image processor on every call.

The processor (``Qwen2VLImageProcessorPil``) handles one image at a time (PIL -> numpy -> resize -> float64
rescale -> normalise -> patchify) and was about a quarter of a single VQAScore call on the tiny Qwen-VL judge
(issue 41). :func:`rewardkit.models.pil_pixel_values` builds the same tensors for the whole batch, bit for bit
(the preference and CLIP paths use it too): the same PIL resize, then one table look-up per 8-bit value in the
patch layout. :class:`JudgePixels` uses it where it reproduces the processor's settings, checks its first batch
against the processor itself (any difference, in values, dtype or grid, retires it for good: the processor is
then used for every later batch), and runs the processor wherever it does not apply:

- an image processor of another class (the torchvision ``Qwen2VLImageProcessor``, which resizes in torch and so
  does not round as PIL does; a remote-code processor): kept, since only transformers' PIL processor is the
  reference :func:`~rewardkit.models.pil_pixel_values` is exact against;
- settings outside what it reproduces (a resample filter other than bilinear / bicubic, a rescale factor other
  than 1/255, no RGB conversion, padding; :func:`rewardkit.preprocess.qwen_params`).

The judge's images are canonical 8-bit RGB PIL images (:func:`rewardkit.media._to_pil` converts grey, RGBA,
palette and 16-bit inputs first), so the processor's own RGB conversion has nothing left to do.
"""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["JudgePixels"]


class JudgePixels:
    """``pixels(images) -> {"pixel_values", "image_grid_thw"}`` equal to ``image_processor(images=images,
    return_tensors="pt")``.

    ``fast``: None until the first batch the fast path takes has been checked against the processor, then True
    (the fast path is used) or False (the processor is used); setting it to False forces the processor (the
    benchmark's old path)."""

    def __init__(self, image_processor: Any) -> None:
        self.image_processor = image_processor
        self.fast: bool | None = None

    def processor(self, images: Sequence[Any]) -> dict[str, Any]:
        """The image processor's own output (the reference)."""
        enc = self.image_processor(images=list(images), return_tensors="pt")
        return {"pixel_values": enc["pixel_values"], "image_grid_thw": enc["image_grid_thw"]}

    def __call__(self, images: Sequence[Any]) -> dict[str, Any]:
        if self.fast is False:
            return self.processor(images)
        from ..models.pil_pixels import pil_pixel_values

        got = pil_pixel_values(images, self.image_processor)
        if got is None:  # settings or images this does not reproduce: the processor, this batch
            return self.processor(images)
        if self.fast is None:
            ref = self.processor(images)
            self.fast = _same(got, ref)
            return ref
        return got


def _same(got: dict[str, Any], ref: dict[str, Any]) -> bool:
    import torch

    return all(got[k].dtype == ref[k].dtype and got[k].shape == ref[k].shape and torch.equal(got[k], ref[k])
               for k in ("pixel_values", "image_grid_thw"))
