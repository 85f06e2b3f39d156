"""Reading a diffusion-pipe TOML file and checking one value's type. Every error names the file, the key
and the fix (ConfigError, as the rest of the config code raises)."""
from __future__ import annotations

import os
import tomllib
from typing import Any

from ..config.checks import ConfigError

MODEL_SUFFIXES = (".safetensors", ".sft")  # single files PipeTrain loads through ComfyUI (weights: safetensors only)


def load_toml(path: str | os.PathLike, what: str) -> dict[str, Any]:
    """The parsed TOML file; ConfigError naming the file when it is missing or not TOML."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist: give the path of your diffusion-pipe {what}.") from None
    except IsADirectoryError:
        raise ConfigError(f"{what} {path} is a folder: give the path of the .toml file.") from None
    except OSError as e:
        raise ConfigError(f"cannot read the {what} {path}: {e}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{what} {path} is not valid TOML ({e}): fix the line it names.") from None


class Where:
    """The file a value comes from, for messages: Where(path).of("model.type") -> "main.toml: model.type"."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.base_dir = os.path.dirname(os.path.abspath(self.path))

    def of(self, key: str) -> str:
        return f"{self.path}: {key}"

    def fail(self, key: str, message: str) -> ConfigError:
        return ConfigError(f"{self.of(key)} {message}")

    def number(self, key: str, value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise self.fail(key, f"is {value!r}: give a number, e.g. {key.split('.')[-1]} = 1.0.")
        return float(value)

    def whole(self, key: str, value: Any, low: int = 0) -> int:
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise self.fail(key, f"is {value!r}: give a whole number of at least {low}.")
        return value

    def flag(self, key: str, value: Any) -> bool:
        if not isinstance(value, bool):
            raise self.fail(key, f"is {value!r}: give true or false.")
        return value

    def text(self, key: str, value: Any) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"is {value!r}: give a quoted string.")
        return value

    def path_of(self, key: str, value: Any) -> str:
        """A path, absolute: a relative one is read against the TOML file's folder."""
        return os.path.normpath(os.path.join(self.base_dir, os.path.expanduser(self.text(key, value))))

    def numbers(self, key: str, value: Any) -> list[float]:
        if not isinstance(value, list) or not value:
            raise self.fail(key, f"is {value!r}: give a list of numbers, e.g. {key.split('.')[-1]} = [512].")
        return [self.number(f"{key}[{i}]", v) for i, v in enumerate(value)]


def is_model_file(path: str) -> bool:
    """Whether a model path names one file PipeTrain can load (else a folder: diffusers or official layout)."""
    return path.lower().endswith(MODEL_SUFFIXES)


class Draft:
    """The settings an import builds: `run` (run.json's sections) and `cache` (the cache config, with its
    `dataset`), set by dotted name: draft.set("train.epochs", 10), draft.set("cache.dataset.resolution", 512)."""

    def __init__(self):
        self.run: dict[str, Any] = {}
        self.cache: dict[str, Any] = {"dataset": {}}
        self.output_dir = ""  # the main TOML's output_dir (run_dir is output_dir/<run name>)
        self.dataset_toml = ""  # the main TOML's dataset key, absolute
        self.batch_sizes: list[list[int]] = []  # micro_batch_size_per_gpu's [[resolution, batch], ...], if a list

    def set(self, target: str, value: Any) -> str:
        head, *rest = target.split(".")
        node, keys = (self.cache, rest) if head == "cache" else (self.run, [head] + rest)
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
        return target

    def get(self, target: str, default: Any = None) -> Any:
        head, *rest = target.split(".")
        node, keys = (self.cache, rest) if head == "cache" else (self.run, [head] + rest)
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                return default
            node = node[k]
        return node
