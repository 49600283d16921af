"""What the NFT trainer logs and where: the official script's per-step loss terms (:func:`loss_terms`), and
experiment trackers the way TRL / transformers do it (``report_to: [tensorboard, wandb]`` or ``[none]``),
through the libraries themselves: ``torch.utils.tensorboard.SummaryWriter`` and ``wandb`` (imported lazily;
offline unless ``WANDB_MODE`` or ``WANDB_API_KEY`` says otherwise). ``metrics.jsonl`` and ``curves.png`` are
written whatever ``report_to`` says."""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

import torch

__all__ = ["loss_terms", "Trackers", "check_report_to"]


def _mean_chw(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(x.shape[0], -1).mean(dim=1)


@torch.no_grad()
def loss_terms(v_theta: torch.Tensor, v_old: torch.Tensor, v_ref: torch.Tensor | None, x0: torch.Tensor,
               loss: torch.Tensor, metrics: dict[str, torch.Tensor], adv_clip_max: float) -> dict[str, float]:
    """One backward pass's diagnostics under the official names (``scripts/train_nft_sd3.py`` of
    NVlabs/DiffusionNFT, its ``loss_terms`` dict): ``x0_norm`` / ``x0_norm_max`` (mean / max of ``x0²``),
    ``old_deviate`` / ``old_deviate_max`` (of ``(v_θ − v_old)²``), ``policy_loss`` (ours: without the KL term;
    the official value includes it), ``unweighted_policy_loss`` (the official ``ori_policy_loss.mean()``: the
    policy loss before the ``× adv_clip_max`` factor), ``kl_div`` (``(v_θ − v_ref)²``), ``old_kl_div``
    (``(v_old − v_ref)²``: how far the rollout policy is from the base model), ``total_loss``; and ours:
    ``policy_loss_plain_mse`` (the policy loss without the adaptive x0 weighting). ``kl_div`` / ``old_kl_div``
    are NaN when ``train.kl_coef`` is 0 (no reference forward)."""
    v_theta, v_old = v_theta.detach().float(), v_old.detach().float()
    x0 = x0.float()
    nan = float("nan")
    policy = float(metrics["policy_loss"])
    out = {
        "x0_norm": float(torch.mean(x0 ** 2)), "x0_norm_max": float(torch.max(x0 ** 2)),
        "old_deviate": float(torch.mean((v_theta - v_old) ** 2)),
        "old_deviate_max": float(torch.max((v_theta - v_old) ** 2)),
        "policy_loss": policy, "unweighted_policy_loss": policy / adv_clip_max,
        "policy_loss_plain_mse": float(metrics["policy_loss_plain_mse"]),
        "kl_div": nan, "old_kl_div": nan, "total_loss": float(loss.detach()),
    }
    if v_ref is not None:
        ref = v_ref.detach().float()
        out["kl_div"] = float(_mean_chw((v_theta - ref) ** 2).mean())
        out["old_kl_div"] = float(_mean_chw((v_old - ref) ** 2).mean())
    return out


def check_report_to(report_to: list[str]) -> None:
    """Fail at start (before any model loads) when a requested tracker's library is missing."""
    from .._imports import require

    if "tensorboard" in report_to:
        require("tensorboard", "rl")
    if "wandb" in report_to:
        try:
            import wandb  # noqa: F401
        except ImportError:
            from ..errors import MissingDependencyError

            # wandb is in no rewardkit extra: the install command is wandb's own (the CLI's exit 2, not an
            # "internal error, please report it")
            exc = MissingDependencyError("wandb", "rl", "report_to: wandb")
            exc.install_command = "pip install wandb"
            exc.msg = ("'wandb' is not installed (needed for report_to: wandb). Install it with:\n    pip install "
                       "wandb\n(or report_to=tensorboard / report_to=none)")  # (ImportError's str is its msg)
            exc.args = (exc.msg,)
            raise exc from None


def _wandb_mode() -> str:
    """``WANDB_MODE`` when set; else online with an API key in the environment, offline otherwise (no network
    needed; ``wandb sync`` uploads later)."""
    mode = os.environ.get("WANDB_MODE")
    if mode:
        return mode
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


class Trackers:
    """The trackers of ``report_to`` on the main process (other processes get an inert instance).

    ``resume_step``: the optimizer step a resumed run restarts after; TensorBoard drops the killed run's events
    logged after it (``SummaryWriter(purge_step=...)``), so a resumed run's curves have each step once.
    ``wandb_id``: the wandb run id saved in that checkpoint; the resumed run continues that run
    (``wandb.init(id=..., resume="allow")``) instead of starting a new one.
    """

    def __init__(self, report_to: list[str], out: Path, *, main: bool, run_name: str = "",
                 config: dict[str, Any] | None = None, resume_step: int | None = None,
                 wandb_id: str | None = None):
        self.tb = None
        self.wandb = None
        if not main:
            return
        if "tensorboard" in report_to:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(log_dir=str(out / "tensorboard"),
                                    purge_step=None if resume_step is None else resume_step + 1)
        if "wandb" in report_to:
            import wandb

            self.wandb = wandb.init(project=os.environ.get("WANDB_PROJECT", "rewardkit-nft"),
                                    name=run_name or out.resolve().name, config=config, dir=str(out),
                                    mode=_wandb_mode(), id=wandb_id, resume="allow")

    def log(self, values: dict[str, Any], step: int) -> None:
        """Finite scalars only (a NaN would break TensorBoard's plots; it is in ``metrics.jsonl`` as null)."""
        scalars = {k: float(v) for k, v in values.items()
                   if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))}
        if self.tb is not None:
            for k, v in scalars.items():
                self.tb.add_scalar(k, v, step)
        if self.wandb is not None and scalars:
            self.wandb.log(scalars, step=step)

    def log_images(self, tag: str, images: torch.Tensor, step: int, captions: list[str]) -> None:
        """``images`` float ``[N, 3, H, W]`` in [0, 1]."""
        if self.tb is not None and len(images):
            self.tb.add_images(tag, images.clamp(0, 1), step, dataformats="NCHW")
            self.tb.add_text(f"{tag}/captions", "\n\n".join(f"{i}: {c}" for i, c in enumerate(captions)), step)
        if self.wandb is not None and len(images):
            import wandb

            pics = [wandb.Image((im.clamp(0, 1).permute(1, 2, 0).numpy() * 255).round().astype("uint8"), caption=c)
                    for im, c in zip(images.float().cpu(), captions)]
            self.wandb.log({tag: pics}, step=step)

    def flush(self) -> None:
        if self.tb is not None:
            self.tb.flush()

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
