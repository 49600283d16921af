"""Template + processor -> model inputs for :class:`~rewardkit.models.preference.PreferenceModel`: the versioned
input template (:class:`PreferenceTemplate`) and the encoder that applies it (:class:`InputEncoder`); both
re-exported by :mod:`rewardkit.models.preference`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch

__all__ = ["InputEncoder", "PreferenceTemplate", "REWARD_TOKEN"]

REWARD_TOKEN = "<|reward|>"
_SLOT = "\uE000rewardkit-prompt\uE000"  # private-use sentinel marking where the prompt goes


# ---------------------------------------------------------------------------------------------- template
@dataclass
class PreferenceTemplate:
    """The versioned input template. Changing any text changes what the model sees: bump ``version``."""

    version: str = "rewardkit-preference-v1"
    system: str | None = None
    t2i: str = "Prompt: {prompt}\nRate how well the image follows the prompt and how good it looks."
    edit: str = ("Instruction: {prompt}\nThe first image is the source; the last image is the edited result. "
                 "Rate how well the edit follows the instruction and how good it looks.")
    multi_ref: str = ("Instruction: {prompt}\nThe first {n_sources} images are references; the last image is the "
                      "result. Rate how well it follows the instruction and how good it looks.")
    reward_token: str = REWARD_TOKEN
    #: True when the texts above already contain the reward token (HPSv3 / EditReward put it inside the user
    #: text); False appends it after the assistant prefix (rewardkit's own models).
    reward_token_in_text: bool = False

    def messages(self, prompt: str, n_sources: int) -> list[dict[str, Any]]:
        """HF chat messages for one sample: sources first, then the candidate image, then the text."""
        text = (self.t2i if n_sources == 0 else self.edit if n_sources == 1 else self.multi_ref)
        content = [{"type": "image"} for _ in range(n_sources + 1)]
        content.append({"type": "text", "text": text.format(prompt=prompt, n_sources=n_sources)})
        msgs = [{"role": "system", "content": self.system}] if self.system else []
        return msgs + [{"role": "user", "content": content}]

    def render(self, processor: Any, prompt: str, n_sources: int) -> str:
        text = processor.apply_chat_template(self.messages(prompt, n_sources), tokenize=False,
                                             add_generation_prompt=True)
        return text if self.reward_token_in_text else text + self.reward_token

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "PreferenceTemplate":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"template has unknown keys {sorted(unknown)} (saved by a newer rewardkit?)")
        return cls(**d)


# ---------------------------------------------------------------------------------------------- encoder
@dataclasses.dataclass
class InputEncoder:
    """Applies the template and the processor: B samples -> processor tensors (see ``PreferenceModel.encode``).

    The chat template is rendered once per number of source images with a sentinel in place of the prompt;
    each sample then only splices its prompt in (checked once against a direct rendering; a template that
    transforms its content falls back to rendering every sample). Token ids of each distinct text are cached
    and image placeholders expanded at the id level (checked once against the processor's own output; any
    difference retires the fast path for good).
    """

    processor: Any
    template: PreferenceTemplate
    _parts: dict = dataclasses.field(default_factory=dict, repr=False)
    _tok_cache: dict = dataclasses.field(default_factory=dict, repr=False)
    _fast: bool | None = dataclasses.field(default=None, repr=False)  # None: not yet verified
    _tensor_ok: bool | None = dataclasses.field(default=None, repr=False)  # tensor path; None: not yet verified

    def render(self, prompt: str, n_sources: int) -> str:
        parts = self._parts.get(n_sources)
        if parts is None:
            whole = self.template.render(self.processor, _SLOT, n_sources)
            parts = tuple(whole.split(_SLOT)) if whole.count(_SLOT) == 1 else False
            probe = "a probe {x} prompt  "
            if parts and parts[0] + probe + parts[1] != self.template.render(self.processor, probe, n_sources):
                parts = False
            self._parts[n_sources] = parts
        if parts is False:
            return self.template.render(self.processor, prompt, n_sources)
        return parts[0] + prompt + parts[1]

    def encode(self, images: Sequence[Any], prompts: Sequence[str],
               sources: Sequence[Sequence[Any]] | None = None) -> dict[str, torch.Tensor]:
        n = len(images)
        if len(prompts) != n or (sources is not None and len(sources) != n):
            raise ValueError("images, prompts and sources must have the same length")
        texts, flat = [], []
        for i in range(n):
            srcs = list(sources[i]) if sources is not None and sources[i] is not None else []
            texts.append(self.render(prompts[i], len(srcs)))
            flat.extend(srcs)  # sources first, then the candidate (the template's image order)
            flat.append(images[i])
        if self._fast is False:
            return dict(self.processor(text=texts, images=flat, padding=True, return_tensors="pt"))
        fast = self._encode_fast(texts, flat)
        if self._fast is None:  # first batch: the fast path must reproduce the processor exactly, else retire it
            ref = dict(self.processor(text=texts, images=flat, padding=True, return_tensors="pt"))
            same = fast is not None and set(fast) == set(ref) and all(torch.equal(fast[k], ref[k]) for k in ref)
            self._fast = bool(same)
            return ref
        return fast

    def _encode_fast(self, texts: list[str], flat: list[Any]) -> dict[str, torch.Tensor] | None:
        """The processor's output built from per-text token ids cached across calls (Qwen-VL processors).

        The processor tokenizes every text after expanding each image placeholder to the image's token
        count; here each distinct text is tokenized once (with one placeholder per image) and the
        placeholders are expanded at the id level. Verified against the processor on the first batch.
        """
        proc = self.processor
        tok = proc.tokenizer
        if getattr(proc, "image_token", None) is None or not hasattr(proc, "image_processor"):
            return None
        merge = int(getattr(proc.image_processor, "merge_size", 0) or 0)
        if not merge or tok.pad_token_id is None:
            return None
        from .pil_pixels import pil_pixel_values

        img = pil_pixel_values(flat, proc.image_processor) \
            or dict(proc.image_processor(images=flat, return_tensors="pt"))
        counts = (img["image_grid_thw"].prod(-1) // merge ** 2).tolist()
        text = self._expand_ids(texts, counts)
        return None if text is None else {**text, **img}

    def _ids(self, text: str, pad_id: int) -> tuple[list[int], int, dict]:
        """``text``'s token ids, its number of image placeholders and its expansions (cached across calls)."""
        cache = self._tok_cache
        hit = cache.get(text)
        if hit is None:
            ids = self.processor.tokenizer(text, add_special_tokens=True)["input_ids"]
            if len(cache) > 4096:
                cache.clear()
            hit = cache[text] = (ids, ids.count(pad_id), {})
        return hit

    def length_order(self, images: Sequence[Any], prompts: Sequence[str],
                     sources: Sequence[Sequence[Any]] | None = None) -> list[int] | None:
        """The samples in order of their sequence length (a stable sort), predicted without building any pixels
        (each text's cached token ids, each PIL image's ``smart_resize`` grid), or None: the samples of each
        length already sit together (or there are fewer than 3), or the lengths cannot be predicted (not a
        Qwen-VL processor, the fast path retired, an input that is not a PIL image or that ``smart_resize``
        refuses: the encoding then says why). Only an order: a wrong prediction costs copies in
        :func:`split_by_length`, never a different input to the model."""
        n = len(images)
        proc = self.processor
        if n < 3 or self._fast is False or getattr(proc, "image_token", None) is None \
                or not hasattr(proc, "image_processor") or len(prompts) != n \
                or (sources is not None and len(sources) != n):
            return None
        from ..preprocess import qwen_params, smart_resize

        p = qwen_params(proc.image_processor)
        if p is None:
            return None
        pad_id = proc.tokenizer.convert_tokens_to_ids(proc.image_token)
        grids: dict[tuple[int, int], int] = {}
        lengths = []
        try:
            for i in range(n):
                srcs = list(sources[i]) if sources is not None and sources[i] is not None else []
                ids, n_img, _ = self._ids(self.render(prompts[i], len(srcs)), pad_id)
                if n_img != len(srcs) + 1:
                    return None
                total = len(ids) - n_img
                for im in (*srcs, images[i]):
                    w, h = im.size
                    if (h, w) not in grids:
                        hh, ww = smart_resize(int(h), int(w), p.factor, p.min_pixels, p.max_pixels)
                        grids[(h, w)] = (hh // p.patch_size) * (ww // p.patch_size) // p.merge_size ** 2
                    total += grids[(h, w)]
                lengths.append(total)
        except (AttributeError, TypeError, ValueError):
            return None
        runs = [x for i, x in enumerate(lengths) if i == 0 or x != lengths[i - 1]]
        if len(runs) == len(set(runs)):  # every length's samples are one run already
            return None
        return sorted(range(n), key=lengths.__getitem__)

    def _expand_ids(self, texts: list[str], counts: list[int]) -> dict[str, torch.Tensor] | None:
        """Token ids of ``texts`` with the k-th image placeholder (in text order) repeated ``counts[k]`` times,
        padded on the tokenizer's side: ``input_ids``, ``attention_mask``, ``mm_token_type_ids`` ``[B, T]``.
        None when the placeholders and ``counts`` do not line up."""
        tok = self.processor.tokenizer
        pad_id = tok.convert_tokens_to_ids(self.processor.image_token)
        rows, k = [], 0
        for t in texts:
            ids, n_img, expanded = self._ids(t, pad_id)
            key = tuple(counts[k:k + n_img])
            if len(key) != n_img:
                return None
            k += n_img
            row = expanded.get(key)
            if row is None:  # each (text, image sizes) is expanded once, and kept as a tensor
                ids_row: list[int] = []
                it = iter(key)
                for tid in ids:
                    ids_row.extend([pad_id] * next(it) if tid == pad_id else (tid,))
                if len(expanded) > 64:
                    expanded.clear()
                row = expanded[key] = torch.tensor(ids_row, dtype=torch.long)
            rows.append(row)
        if k != len(counts):
            return None
        lens = [int(r.shape[0]) for r in rows]
        width = max(lens)
        if min(lens) == width:  # no padding: the rows as they are
            input_ids = torch.stack(rows)
            mask = torch.ones((len(rows), width), dtype=torch.long)
        else:
            left = tok.padding_side == "left"
            input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
            for i, r in enumerate(rows):
                (input_ids[i, width - len(r):] if left else input_ids[i, :len(r)]).copy_(r)
            col, n_tok = torch.arange(width).unsqueeze(0), torch.tensor(lens).unsqueeze(1)
            mask = ((col >= width - n_tok) if left else (col < n_tok)).long()
        return {"input_ids": input_ids, "attention_mask": mask, "mm_token_type_ids": (input_ids == pad_id).long()}

    # ---------------------------------------------------------------- tensor path (issue 12)
    def tensor_params(self):
        """The image processor as torch pre-processing parameters, or None when the torch path cannot
        reproduce it (or an earlier check against the processor found a difference)."""
        from ..preprocess import qwen_params

        if self._tensor_ok is False or getattr(self.processor, "image_token", None) is None \
                or self.processor.tokenizer.pad_token_id is None:
            return None
        return qwen_params(self.processor.image_processor)

    def encode_tensor(self, images: torch.Tensor, prompts: Sequence[str]) -> dict[str, torch.Tensor] | None:
        """B text-to-image samples from a float tensor ``[B, 3, H, W]`` in [0, 1] -> the processor's keys, with
        ``pixel_values`` computed in torch on ``images``' device (differentiable) and token ids on the CPU.

        The first call checks token ids, masks and ``image_grid_thw`` against the processor run on blank PIL
        images of the same size; any difference retires the tensor path (returns None, now and later).
        """
        from ..preprocess import qwen_pixel_values

        params = self.tensor_params()
        if params is None:
            return None
        pixel_values, grid = qwen_pixel_values(images, params)
        counts = (grid.prod(-1) // params.merge_size ** 2).tolist()
        texts = [self.render(p, 0) for p in prompts]
        text = self._expand_ids(texts, counts)
        if self._tensor_ok is None:
            from PIL import Image

            h, w = int(images.shape[-2]), int(images.shape[-1])
            blank = [Image.new("RGB", (w, h)) for _ in texts]
            ref = dict(self.processor(text=texts, images=blank, padding=True, return_tensors="pt"))
            ref.pop("pixel_values", None)
            mine = {} if text is None else {**text, "image_grid_thw": grid}
            self._tensor_ok = (text is not None and set(mine) == set(ref)
                               and all(torch.equal(mine[k], ref[k]) for k in ref))
            if not self._tensor_ok:
                return None
        if text is None:
            return None
        return {**text, "pixel_values": pixel_values, "image_grid_thw": grid}


# ---------------------------------------------------------------------------------------------- length groups
#: the encoded keys :func:`split_by_length` knows how to split (anything else: no split)
_SPLITTABLE = {"input_ids", "attention_mask", "mm_token_type_ids", "pixel_values", "image_grid_thw"}


def split_by_length(enc: dict[str, torch.Tensor], image_token_id: int,
                    merge: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]] | None:
    """A padded batch of encoded samples -> ``[(sample indices, inputs)]``, one entry per distinct sequence
    length, each without padding: the inputs each group would get encoded alone (its samples' rows, the padding
    columns dropped, their images' ``pixel_values`` rows and ``image_grid_thw``). None when every sample has the
    same length (nothing to gain) or the batch holds keys this does not know how to split.

    Why (issue 41): a padded batch gives the language model an explicit attention mask, and PyTorch's CPU SDPA
    with a mask is several times slower per sample than its causal kernel on unpadded rows, so a batch of mixed
    image sizes (or prompts) cost more per image than one by one. Images of a sample are found by counting its
    image tokens (``t * h * w / merge**2`` per image, in order)."""
    mask = enc.get("attention_mask")
    ids = enc.get("input_ids")
    if mask is None or ids is None or ids.ndim != 2 or set(enc) - _SPLITTABLE:
        return None
    lengths = mask.sum(1)
    if bool((lengths == lengths[0]).all()):
        return None
    img_rows = img_tokens = None
    if "image_grid_thw" in enc:
        grid = enc["image_grid_thw"]
        img_rows = grid.prod(-1)
        img_tokens = (img_rows // merge ** 2).tolist()
        per_sample = (ids == image_token_id).sum(1).tolist()
        owner, k = [], 0  # image -> sample
        for i, n in enumerate(per_sample):
            while n > 0:
                if k >= len(img_tokens) or img_tokens[k] > n:
                    return None  # the image tokens do not add up: leave the batch as it is
                owner.append(i)
                n -= img_tokens[k]
                k += 1
        if k != len(img_tokens) or int(img_rows.sum()) != enc["pixel_values"].shape[0]:
            return None
        owner_t = torch.tensor(owner)
        row_start = torch.cumsum(img_rows, 0) - img_rows
    out = []
    width = mask.shape[1]
    for length in sorted(set(lengths.tolist())):
        idx = torch.nonzero(lengths == length).flatten()
        a, b = int(idx[0]), int(idx[-1]) + 1
        run = b - a == len(idx)  # the group is a run of rows (PreferenceModel.encode_by_length): views, not copies
        sub = {k: enc[k][a:b] if run else enc[k][idx] for k in ("input_ids", "attention_mask", "mm_token_type_ids")
               if k in enc}
        if length != width:  # drop the padding columns
            keep = sub["attention_mask"].bool().any(0)
            sub = {k: v[:, keep] for k, v in sub.items()}
        if img_rows is not None:
            imgs = torch.nonzero(torch.isin(owner_t, idx)).flatten()
            if not len(imgs):
                rows = torch.zeros(0, dtype=torch.long)
            elif run:  # its images are a run too, and so are their rows
                j0, j1 = int(imgs[0]), int(imgs[-1])
                rows = slice(int(row_start[j0]), int(row_start[j1] + img_rows[j1]))
                imgs = slice(j0, j1 + 1)
            else:
                rows = torch.cat([torch.arange(int(row_start[j]), int(row_start[j] + img_rows[j]))
                                  for j in imgs.tolist()])
            sub["pixel_values"] = enc["pixel_values"][rows]
            sub["image_grid_thw"] = enc["image_grid_thw"][imgs]
        out.append((idx, sub))
    return out
