"""compose's ${...} interpolation as the doctor reads compose.yaml: nested defaults included
(`${GLMSERVE_IMAGE:-glmserve/server:0.1.0-sglang${SGLANG_LINE:-...}}`, whose SGLANG_LINE a
one-level reader never saw)."""

from __future__ import annotations

from pathlib import Path

import pytest

from glmserve.doctor import compose

REPO = Path(__file__).resolve().parents[2]
NESTED = "${GLMSERVE_IMAGE:-glmserve/server:0.1.0-sglang${SGLANG_LINE:-0.5.12.post1}}"


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, "glmserve/server:0.1.0-sglang0.5.12.post1"),
        ({"SGLANG_LINE": "0.5.17"}, "glmserve/server:0.1.0-sglang0.5.17"),
        ({"SGLANG_LINE": ""}, "glmserve/server:0.1.0-sglang0.5.12.post1"),  # `:-`: empty too
        ({"GLMSERVE_IMAGE": "mine:1", "SGLANG_LINE": "0.5.17"}, "mine:1"),
    ],
)
def test_nested_defaults(values, expected):
    assert compose.interpolate(NESTED, values) == expected
    assert compose.names_in(NESTED) == {"GLMSERVE_IMAGE", "SGLANG_LINE"}


def test_the_rest_of_compose_template_grammar():
    values = {"A": "1", "E": ""}
    assert compose.interpolate("$$A $A ${A} x$A-y", values) == "$A 1 1 x1-y"
    assert compose.interpolate("${E-unset} ${E:-empty} ${U-unset} ${U:-u}", values) == (
        " empty unset u"
    )
    assert compose.interpolate("${A:+alt} ${E:+alt} ${E+set} ${U+set}", values) == "alt  set "
    assert compose.interpolate("${A:?must} ${U:?must}", values) == "1 "
    assert compose.interpolate("${A:-${B:-${C:-deep}}}", {}) == "deep"
    assert compose.names_in("${A:-${B:-${C:-deep}}} $$D $E") == {"A", "B", "C", "E"}
    assert compose.interpolate("cost ${A", values) == "cost ${A"  # unclosed: left as it is


def test_the_doctor_sees_every_name_of_compose_yaml():
    services = compose.load(REPO / "compose.yaml")["services"]
    assert "SGLANG_LINE" in compose.names_in(services["sglang"]["image"])
