"""CacheConfig: what `python -m engine cache --config cache.json` encodes, with which encoders, on how many ranks.

The headless twin of the CacheLatents node (docs/datasets.md, "Caching from a shell"). Validated
once, before any rank starts, with messages that name the setting and the fix. Relative paths
are read against the config file's folder; a model may also be named as ComfyUI lists it (a file
under <comfyui_root>/models/vae, text_encoders, clip, clip_vision or checkpoints). Plain data: no torch, no comfy.
"""
from __future__ import annotations

import ast
import dataclasses
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..cache.first_frame import DEFAULT_STYLE, check_style
from ..cache.audio_latents import audio_conflict
from ..cache.items import CONTROL_STYLES, control_style_conflict
from ..data.messages import DatasetError
from ..data.scan import DatasetSpec
from .checks import ConfigError
from ..atomic_files import write_text
from .run import _check

CACHE_CONFIG_VERSION = 1
MODEL_FOLDERS = {"vae": ("vae",), "clip": ("text_encoders", "clip"), "checkpoint": ("checkpoints",),
                 "clip_vision": ("clip_vision",), "audio_vae": ("checkpoints", "vae")}
CLIP_VISION_CROPS = ("center", "none")  # CLIPVisionEncode's crop choices


@dataclass(frozen=True)
class CacheConfig:
    comfyui_root: str  # the ComfyUI folder whose comfy.* loads and runs the encoders
    dataset: DatasetSpec  # LoadDataset's output as JSON (engine/data/scan.py); folders absolute after loading
    vae: str = ""  # a VAE file (VAELoader); "" = the checkpoint's
    clip: tuple[str, ...] = ()  # text encoder file(s) for comfy.sd.load_clip (CLIPLoader, 2-3 for Dual/Triple)
    clip_type: str = "stable_diffusion"  # CLIPLoader's type: a comfy.sd.CLIPType name in lower case
    checkpoint: str = ""  # a full checkpoint: its VAE and text encoder where vae / clip are not given
    first_frame_conditioning: bool = False  # CacheLatents' input of the same name
    first_frame_style: str = DEFAULT_STYLE  # CacheLatents' first_frame_style (engine/cache/first_frame.py)
    control_style: str = CONTROL_STYLES[0]  # CacheLatents' control_style: how control images are stored
    clip_vision: str = ""  # a CLIP-vision file (CLIPVisionLoader): each item's first frame encoded with it; "" = none
    clip_vision_crop: str = "center"  # CacheLatents' clip_vision_crop (CLIPVisionEncode's crop): center or none
    # an audio VAE file (Load LTXV Audio VAE's, or a plain audio VAE): each item packed with its sound; "" = none
    audio_vae: str = ""
    regenerate: bool = False
    trust_cache: bool = False
    processes: int = 1  # ranks on this machine: one per GPU (CPU processes where there is no CUDA)
    gpu_ids: str = ""  # e.g. "0,1"; "" = the first `processes` GPUs
    timeout_s: int = 86400  # how long a rank waits for the others (the scan on rank 0, the slowest shard)
    expect_identity: str = ""  # the encoders' identity the ranks must find (CacheLatents: its graph's); "" = any
    version: int = CACHE_CONFIG_VERSION

    def validate(self) -> None:
        _check(self.version == CACHE_CONFIG_VERSION, f"cache config version {self.version}: this PipeTrain reads "
               f"version {CACHE_CONFIG_VERSION}; set \"version\": {CACHE_CONFIG_VERSION}.")
        _check(os.path.isfile(os.path.join(self.comfyui_root, "comfy", "sd.py")),
               f"comfyui_root {self.comfyui_root} is not a ComfyUI folder (no comfy/sd.py): give the folder that holds "
               "ComfyUI's main.py.")
        try:
            self.dataset.check()
        except DatasetError as e:
            raise ConfigError(f"dataset: {e}") from None
        for n, part in enumerate(self.dataset.parts):  # chained datasets: dataset.more[n - 1]
            where = "dataset" if n == 0 else f"dataset.more[{n - 1}]"
            for setting, folder in [(f"{where}.folders[{i}]", f.path) for i, f in enumerate(part.folders)] + \
                    [(f"{where}.mask_folder", part.mask_folder), (f"{where}.control_folder", part.control_folder)]:
                _check(not folder or os.path.isdir(folder), f"{setting}: the folder {folder} does not exist; fix the "
                       "path (relative paths are read against the config file's folder).")
        _check(bool(self.vae or self.checkpoint), "no VAE: set \"vae\" to a VAE file, or \"checkpoint\" to a "
               "checkpoint that contains one.")
        _check(bool(self.clip or self.checkpoint), "no text encoder: set \"clip\" to the text encoder file(s), or "
               "\"checkpoint\" to a checkpoint that contains one.")
        for setting, path in [("vae", self.vae), ("checkpoint", self.checkpoint), ("clip_vision", self.clip_vision),
                              ("audio_vae", self.audio_vae)] + \
                [("clip", p) for p in self.clip]:
            _check(not path or os.path.isfile(path), f"{setting}: the file {path} does not exist; give a path or a file "
                   f"name from ComfyUI's models/{MODEL_FOLDERS[setting][0]} folder.")
        problem = check_style(self.first_frame_style, "first_frame_style")
        _check(problem is None, problem or "")
        _check(self.first_frame_style == DEFAULT_STYLE or self.first_frame_conditioning, "first_frame_style is set but "
               "first_frame_conditioning is not: set \"first_frame_conditioning\": true, or remove first_frame_style.")
        _check(self.control_style in CONTROL_STYLES, f"control_style {self.control_style!r}: use "
               f"{' or '.join(repr(c) for c in CONTROL_STYLES)} (docs/datasets.md, control images).")
        problem = control_style_conflict(self.control_style, self.first_frame_conditioning, self.dataset.control_folder)
        _check(problem is None, problem or "")
        if self.audio_vae:
            for part in self.dataset.parts:
                problem = audio_conflict(self.first_frame, part.mask_folder)
                _check(problem is None, problem or "")
        _check(self.clip_vision_crop in CLIP_VISION_CROPS, f"clip_vision_crop {self.clip_vision_crop!r}: use "
               "\"center\" or \"none\" (CLIPVisionEncode's crop; what your sampling workflow uses).")
        _check(self.clip_vision_crop == "center" or bool(self.clip_vision), "clip_vision_crop is set but "
               "clip_vision is not: set \"clip_vision\" to the CLIP-vision file (models/clip_vision), or remove "
               "clip_vision_crop.")
        types = clip_types(self.comfyui_root)
        _check(self.clip_type in types, f"clip_type {self.clip_type!r} is not one ComfyUI knows: choose one of "
               f"{', '.join(types)} (CLIPLoader's 'type').")
        _check(1 <= self.processes <= 1024, f"processes is {self.processes}: use 1 or more (one per GPU).")
        if self.gpu_ids:
            _check(re.fullmatch(r"\d+(,\d+)*", self.gpu_ids) is not None,
                   f"gpu_ids {self.gpu_ids!r} is not a comma-separated list of GPU numbers like '0,1'.")
            n = len(self.gpu_ids.split(","))
            _check(n == self.processes, f"gpu_ids lists {n} GPUs but processes is {self.processes}: make them agree.")
        _check(1 <= self.timeout_s <= 30 * 86400, f"timeout_s is {self.timeout_s}: use a number of seconds such as "
               "86400 (how long a rank waits for the slowest one).")

    @property
    def first_frame(self) -> str:
        """The first-frame style the cache stores ("" = none), as encode_shard and cache_identity take it."""
        return self.first_frame_style if self.first_frame_conditioning else ""

    def to_dict(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return {**d, "dataset": self.dataset.to_dict(), "clip": list(self.clip)}

    @classmethod
    def from_dict(cls, data: Any, base_dir: str = ".") -> CacheConfig:
        """Build and validate; relative paths (folders, files) are read against base_dir."""
        _check(isinstance(data, dict), f"the cache config must be a JSON object, got {type(data).__name__}.")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        _check(not unknown, f"unknown setting(s) in the cache config: {', '.join(unknown)}. Remove them or check the "
               f"spelling (known: {', '.join(fields)}).")
        for name in ("comfyui_root", "dataset"):
            _check(name in data, f"the cache config has no \"{name}\": add it (docs/datasets.md shows an example).")
        kwargs: dict[str, Any] = {}
        for name, value in data.items():
            default = fields[name].default
            if name == "dataset":
                kwargs[name] = _dataset(value, base_dir)
            elif name == "clip":
                files = [value] if isinstance(value, str) else value
                _check(isinstance(files, list) and all(isinstance(p, str) and p for p in files),
                       "clip must be a file name or a list of file names (2-3 for Dual/Triple CLIP models).")
                kwargs[name] = tuple(files)
            elif isinstance(default, bool):
                _check(isinstance(value, bool), f"{name} must be true or false.")
                kwargs[name] = value
            elif isinstance(default, int):
                _check(isinstance(value, int) and not isinstance(value, bool), f"{name} must be a whole number.")
                kwargs[name] = value
            else:
                _check(isinstance(value, str), f"{name} must be a string.")
                kwargs[name] = value
        root = _absolute(kwargs["comfyui_root"], base_dir)
        models = os.path.join(root, "models")
        kwargs["comfyui_root"] = root
        for name in ("vae", "checkpoint", "clip_vision", "audio_vae"):
            if kwargs.get(name):
                kwargs[name] = model_file(kwargs[name], base_dir, models, MODEL_FOLDERS[name])
        kwargs["clip"] = tuple(model_file(p, base_dir, models, MODEL_FOLDERS["clip"]) for p in kwargs.get("clip", ()))
        cfg = cls(**kwargs)
        cfg.validate()
        return cfg

    @classmethod
    def load(cls, path: str | os.PathLike) -> CacheConfig:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as e:
            raise ConfigError(f"cannot read the cache config {path}: {e}") from e
        return cls.from_dict(data, os.path.dirname(os.path.abspath(path)))

    def save(self, path: str | os.PathLike) -> None:
        write_text(path, json.dumps(self.to_dict(), indent=2, sort_keys=True))


def _absolute(path: str, base_dir: str) -> str:
    return os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))


def model_file(name: str, base_dir: str, models_dir: str, folders: tuple[str, ...]) -> str:
    """A path as given (against base_dir), else the file of that name in ComfyUI's model folders;
    a name found nowhere stays as given, so validate() reports it."""
    candidates = [_absolute(name, base_dir)] + [os.path.join(models_dir, f, name) for f in folders]
    return next((c for c in candidates if os.path.isfile(c)), candidates[0])


def _dataset(value: Any, base_dir: str) -> DatasetSpec:
    """The dataset section: DatasetSpec's JSON, folders as {"path", "repeats"} or plain paths; chained datasets
    in its "more" list, each written the same way."""
    data = _absolute_folders(value, base_dir, "dataset")
    if isinstance(data.get("more"), list):
        data["more"] = [_absolute_folders(part, base_dir, f"dataset.more[{i}]") for i, part in enumerate(data["more"])]
    try:
        return DatasetSpec.from_dict(data)
    except (DatasetError, TypeError) as e:
        raise ConfigError(f"dataset: {e}") from None


def _absolute_folders(value: Any, base_dir: str, where: str) -> dict[str, Any]:
    _check(isinstance(value, dict), f"{where} must be a JSON object like {{\"folders\": [\"cats\"], \"resolution\": 512}}.")
    data = dict(value)
    folders = data.get("folders")
    _check(isinstance(folders, list) and folders, f"{where}.folders must list at least one folder, e.g. [\"cats\"] or "
           "[{\"path\": \"cats\", \"repeats\": 2}].")
    data["folders"] = [_folder(f, base_dir) for f in folders]
    for key in ("mask_folder", "control_folder"):
        if isinstance(data.get(key), str) and data[key]:
            data[key] = _absolute(data[key], base_dir)
    return data


def _folder(entry: Any, base_dir: str) -> dict[str, Any]:
    if isinstance(entry, str):
        entry = {"path": entry}
    _check(isinstance(entry, dict) and isinstance(entry.get("path"), str),
           f"dataset.folders entry {entry!r}: use a path, or {{\"path\": ..., \"repeats\": N}}.")
    return {**entry, "path": _absolute(entry["path"], base_dir)}


def clip_types(comfyui_root: str) -> list[str]:
    """CLIPLoader's type names this ComfyUI knows: comfy.sd.CLIPType's members, read from the source
    (parsed, not run), so the config is checked before any process imports torch."""
    with open(os.path.join(comfyui_root, "comfy", "sd.py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "CLIPType":
            return [t.id.lower() for stmt in node.body if isinstance(stmt, ast.Assign)
                    for t in stmt.targets if isinstance(t, ast.Name)]
    return ["stable_diffusion"]
