"""GLM-5-NVFP4 serving on Blackwell: patched SGLang, launcher, exporter, load tests."""

__version__ = "0.1.0"
