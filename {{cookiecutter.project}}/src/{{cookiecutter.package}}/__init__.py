"""ImageNet-style PyTorch training whose data-loading speed techniques are Hydra switches"""

__version__ = "0.1.0"
