"""vidserve: a video/diffusion inference server for open Wan models."""

__version__ = "0.1.0"
