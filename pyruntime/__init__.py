"""aicpu-tiling: attention tiling computed on the device, and the runtime around it."""

__version__ = "0.1.0"
