"""glmserve.sglang_api is the one statement of the pinned SGLang's surface: the emulator serves
exactly its routes, and its server-info readers find in the emulator's answer what it was told."""

from __future__ import annotations

import pytest

from glmserve import sglang_api
from glmserve.emulator.app import create_app, server_info_dict
from glmserve.emulator.config import EmulatorConfig
from glmserve.exporter.info import server_fields
from glmserve.loadtest.serverinfo import extract


def test_the_emulator_serves_exactly_the_routes_sglang_api_names() -> None:
    app = create_app(EmulatorConfig())
    served = {route.path for route in app.routes}
    named = {
        sglang_api.CHAT_COMPLETIONS,
        sglang_api.COMPLETIONS,
        sglang_api.GENERATE,
        sglang_api.HEALTH,
        sglang_api.HEALTH_GENERATE,
        sglang_api.METRICS,
        sglang_api.MODELS,
        *sglang_api.SERVER_INFO_PATHS,
        *sglang_api.MODEL_INFO_PATHS,
    }
    assert named <= served
    # The rest are variants of named routes (a trailing slash, a path parameter).
    assert {p for p in served - named if not p.startswith(tuple(named))} == set()


def test_readers_agree_with_the_emulators_answer() -> None:
    config = EmulatorConfig(
        model_path="/models/glm", served_model_name="glm", max_total_tokens=1234, tp_size=4
    )
    info = server_info_dict(create_app(config).state.emulator)
    assert sglang_api.info_version(info) == sglang_api.SGLANG_VERSION
    assert sglang_api.info_model(info) == "glm"
    assert sglang_api.info_attention_backend(info) == "flashinfer"
    assert sglang_api.info_kv_pool_tokens(info) == 1234
    assert set(sglang_api.SERVER_ARGS_READ) - set(info) <= {"chunked_prefill_size"}
    # Both consumers read through the same definitions.
    assert server_fields(info)["max_total_num_tokens"] == "1234"
    assert extract(info)["kv_pool_tokens"] == 1234
    assert server_fields(info)["model"] == "glm" and extract(info)["served_model_name"] == "glm"


@pytest.mark.parametrize(
    ("info", "model", "backend", "pool"),
    [
        ({"model_path": "/m", "decode_attention_backend": "fa3"}, "/m", "fa3", None),
        (
            {"served_model_name": "x", "model_path": "/m", "attention_backend": "flashinfer",
             "decode_attention_backend": "fa3", "max_total_num_tokens": 7,
             "internal_states": [{"memory_usage": {"token_capacity": 9}}]},
            "x", "flashinfer", 7,
        ),
        ({"internal_states": [{"memory_usage": {"token_capacity": 9}}]}, None, None, 9),
        ({"internal_states": ["not a dict"]}, None, None, None),
    ],
)  # fmt: skip
def test_server_info_fallbacks(info, model, backend, pool) -> None:
    assert sglang_api.info_model(info) == model
    assert sglang_api.info_attention_backend(info) == backend
    assert sglang_api.info_kv_pool_tokens(info) == pool
