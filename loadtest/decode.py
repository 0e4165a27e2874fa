"""Locust decode suite for SGLang / GLM-5: `locust -f loadtest/decode.py` (docs/loadtest.md).

Thin on purpose: the users, shapes, options and report live in the glmserve.loadtest package.
"""

from glmserve.loadtest.plugin import register
from glmserve.loadtest.shapes import DecodeShape
from glmserve.loadtest.users import DecodeUser

register()

__all__ = ["DecodeShape", "DecodeUser"]
