"""Speculative decoding (MTP) as the launcher sees it: what an argv asks for, and whether the
model dir can serve it.

GLM-5 and DeepSeek-V3 carry their own draft model: one extra decoder layer, the NextN (MTP)
layer, stored after the last target layer (`model.layers.<num_hidden_layers>.*`) and declared by
config.json's `num_nextn_predict_layers`. With `--speculative-algorithm EAGLE` (or NEXTN, its
alias) and no `--speculative-draft-model-path`, SGLang 0.5.12.post1 loads that layer as the
draft (server_args.py `_handle_speculative_decoding` sets the draft path to the model path;
model_config.py turns the architecture into DeepseekV3ForCausalLMNextN). Two ways it goes wrong,
both minutes into loading or never visibly at all:

- config.json has no `num_nextn_predict_layers` (or 0): the draft weight loader raises
  "num_nextn_predict_layers is not in the config" (deepseek_weight_loader.py) after the target
  weights have loaded;
- config.json declares the layer but the checkpoint was exported without it (lukealonso's
  GLM-5-NVFP4 and Mapika's GLM-5.2-NVFP4 do this, as their MTP-restoring forks say): SGLang
  loads no draft weights, does not complain, and drafts from random weights, so acceptance stays
  near 1 token per step and MTP only costs time.

Both are refused here, before anything starts, in one line. Every flag is read as SGLang's own
parser reads it (glmserve.launch.sglang_argv.ServerArgs: abbreviations, `=` forms, the last
occurrence). Stdlib only (the launcher runs in the SGLang image).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from glmserve.launch.errors import LaunchError

if TYPE_CHECKING:
    from glmserve.launch.sglang_argv import ServerArgs

# SGLang treats NEXTN as EAGLE (server_args.py _resolve_speculative_algorithm_alias).
NEXTN_ALGORITHMS = ("EAGLE", "NEXTN")
# With --max-running-requests unset, SGLang caps a speculative server at this many running
# requests (server_args.py _handle_speculative_decoding, every algorithm but NGRAM's own path).
SPECULATIVE_DEFAULT_MAX_RUNNING = 48
# What SGLang adds to its own mem-fraction reserve for an EAGLE-style draft and its CUDA graphs
# when --mem-fraction-static is left to it (server_args.py _handle_gpu_memory_settings), MiB.
DRAFT_RESERVE_MIB = {"STANDALONE": 6 * 1024, "NGRAM": 0}
DEFAULT_DRAFT_RESERVE_MIB = 4 * 1024
INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MAX_HEADER_BYTES = 100 << 20  # a safetensors header is JSON; a larger one is no header


@dataclass(frozen=True)
class Speculative:
    """The speculative-decoding flags of an argv, as SGLang's parser reads them."""

    algorithm: str  # upper case, as SGLang normalizes it
    num_steps: int | None
    eagle_topk: int | None
    num_draft_tokens: int | None
    draft_model_path: str | None

    @property
    def uses_nextn_layer(self) -> bool:
        """The draft is the model's own NextN layer (no separate draft checkpoint)."""
        return self.algorithm in NEXTN_ALGORITHMS and not self.draft_model_path

    @property
    def tokens_per_verify(self) -> int | None:
        """Query tokens per request in one target verify pass (1 + drafts): SGLang sets it to
        num_steps + 1 when topk is 1, whatever --speculative-num-draft-tokens says."""
        if self.eagle_topk == 1 and self.num_steps is not None:
            return self.num_steps + 1
        return self.num_draft_tokens

    def as_dict(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm,
            "num_steps": self.num_steps,
            "eagle_topk": self.eagle_topk,
            "num_draft_tokens": self.tokens_per_verify,
            "draft": self.draft_model_path or "the model's own NextN layer",
        }


def from_args(args: ServerArgs) -> Speculative | None:
    """The speculative settings an argv asks for, or None when it asks for none. The numbers
    arrive as SGLang's parser converted them (it refuses a value that is not an integer);
    --speculative-draft-model is the draft path's alias, one dest with it."""
    algorithm = args.get("--speculative-algorithm")
    if not algorithm:
        return None
    return Speculative(
        algorithm=str(algorithm).upper(),
        num_steps=args.get("--speculative-num-steps"),
        eagle_topk=args.get("--speculative-eagle-topk"),
        num_draft_tokens=args.get("--speculative-num-draft-tokens"),
        draft_model_path=args.get("--speculative-draft-model-path"),
    )


def effective_config(config: Mapping[str, Any], args: ServerArgs) -> dict[str, Any]:
    """config.json as SGLang sees it: --json-model-override-args applied with dict.update
    (model_config.py), which is how the tiny bench model gets its NextN layer."""
    merged = dict(config)
    raw = args.get("--json-model-override-args")
    if raw:
        try:
            override = json.loads(raw)
        except ValueError:
            override = None  # sglang_argv.check_args refuses it
        if isinstance(override, dict):
            merged.update(override)
    return merged


def nextn_layer_id(config: Mapping[str, Any]) -> int:
    """Where the NextN layer's weights live: model.layers.<this>.* (deepseek_weight_loader.py:
    0 for a one-layer config, else num_hidden_layers)."""
    layers = config.get("num_hidden_layers")
    return 0 if layers == 1 else int(layers or 0)


def weight_names(model_dir: Path) -> list[str] | None:
    """The tensor names of the checkpoint: the shard index's weight map, else the header of a
    single model.safetensors; None when there are no safetensors weights to read."""
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            raw = json.loads(index.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise LaunchError(f"{index} is not readable JSON ({exc})") from None
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict):
            raise LaunchError(f"{index} has no weight_map object")
        return list(weight_map)
    single = model_dir / SINGLE_FILE
    if single.is_file():
        try:
            with single.open("rb") as fh:
                (size,) = struct.unpack("<Q", fh.read(8))
                if size > MAX_HEADER_BYTES:
                    raise ValueError(f"header of {size} bytes")
                header = json.loads(fh.read(size))
        except (OSError, ValueError, struct.error) as exc:
            raise LaunchError(f"{single} has no readable safetensors header ({exc})") from None
        return [name for name in header if name != "__metadata__"]
    return None


def check_draft_layer(
    config: Mapping[str, Any], model_dir: Path, args: ServerArgs, who: str
) -> None:
    """Refuse, in one line, speculative decoding from the model's own NextN layer when the
    model dir has none: not declared in config.json (after --json-model-override-args), or
    declared with no weights of that layer in the checkpoint. `who` names what asked for it."""
    spec = from_args(args)
    if spec is None or not spec.uses_nextn_layer:
        return
    asked = (
        f"{who} asks for MTP speculative decoding (--speculative-algorithm {spec.algorithm}, "
        "drafting with the model's own NextN layer)"
    )
    fix = (
        "use a checkpoint that carries the MTP layer (docs/deploy.md, 'MTP speculative "
        "decoding') or a profile without MTP"
    )
    merged = effective_config(config, args)
    declared = merged.get("num_nextn_predict_layers")
    if not isinstance(declared, int) or isinstance(declared, bool) or declared < 1:
        state = "is missing" if declared is None else f"is {declared!r}"
        raise LaunchError(
            f"{asked}, but in {model_dir}/config.json num_nextn_predict_layers {state}: "
            f"the model has no NextN layer; {fix}"
        )
    load_format = args.get("--speculative-draft-load-format") or args.get("--load-format")
    if load_format == "dummy":
        return  # random weights by request: nothing to look for
    names = weight_names(model_dir)
    if names is None:
        return  # no safetensors to read (another format): SGLang's loader decides
    layer = nextn_layer_id(merged)
    prefix = f"model.layers.{layer}."
    if not any(name.startswith(prefix) for name in names):
        where = INDEX_FILE if (model_dir / INDEX_FILE).is_file() else SINGLE_FILE
        raise LaunchError(
            f"{asked}, but {model_dir}: config.json declares num_nextn_predict_layers "
            f"{declared} while {where} holds no weight of layer {layer} ({prefix}*): the "
            "checkpoint was exported without its MTP layer, and SGLang would draft from random "
            f"weights without a word (acceptance about 1 token per step); {fix}"
        )


def max_running_requests(args: ServerArgs) -> int | None:
    """--max-running-requests as SGLang will run it: the argv's, else its speculative cap
    (None: unset without speculative decoding, SGLang sizes it from the KV pool)."""
    running = args.get("--max-running-requests")
    if running is None and from_args(args) is not None:
        return SPECULATIVE_DEFAULT_MAX_RUNNING
    return running


def draft_reserve_mib(args: ServerArgs) -> int:
    """SGLang's extra mem-fraction reserve for a draft model and its graphs (0 without one)."""
    spec = from_args(args)
    if spec is None:
        return 0
    return DRAFT_RESERVE_MIB.get(spec.algorithm, DEFAULT_DRAFT_RESERVE_MIB)
