"""SGLang-protocol emulator with controlled timing: a TEST INSTRUMENT, never a serving engine.

It answers the routes of the default SGLang line (glmserve.sglang_api: OpenAI chat/completions,
/generate, health, info, /metrics) with deterministic token timing, so the exporter, dashboards,
load tests and stack tests can run without a GPU. See docs/emulator.md.
"""

from glmserve.emulator.app import create_app
from glmserve.emulator.config import EmulatorConfig
from glmserve.emulator.costmodel import DecodeCostModel

__all__ = ["DecodeCostModel", "EmulatorConfig", "create_app"]
