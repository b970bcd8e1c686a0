"""GAN training with attn2d attention (SAGAN against YLG-SAGAN): data, models, attention
schedules, SWD / FID / KID, and the `attn2d train-gan` loop."""

from . import schedules
from .schedules import Constant, Mixed, PlateauWindow, ProgressiveWindow, Schedule

__all__ = ["Constant", "Mixed", "PlateauWindow", "ProgressiveWindow", "Schedule", "schedules"]
