"""Server-wide settings: `VIDSERVE_*` environment variables, overridden by CLI flags."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="VIDSERVE_", extra="ignore")

    data_dir: Path = Field(Path("./data"), description="Job database, outputs and exported models live here.")
    default_model: str = Field("wan-tiny", description="Model used when a request names none.")
    device: str = Field("auto", description="'auto' (cuda if available, else cpu), 'cpu', 'cuda', 'cuda:N'.")
    dtype: str = Field("auto", description="'auto' (bfloat16 on CUDA, float32 on CPU), 'float32', 'bfloat16', 'float16'.")

    # Request limits: anything past them is rejected before it reaches a model.
    max_seconds: float = Field(20.0, gt=0, description="Longest clip a request may ask for.")
    max_frames: int = Field(481, gt=0, description="Most frames a request may ask for (4k+1).")
    max_side: int = Field(1280, gt=0, description="Largest width or height in pixels.")
    max_steps: int = Field(100, gt=0, description="Most denoising steps a request may ask for.")
    max_image_pixels: int = Field(4096 * 4096, gt=0, description="Largest conditioning image (width*height).")


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
