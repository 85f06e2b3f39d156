"""diffusion-pipe configs to and from PipeTrain (engine/dpconfig): every key of the fixtures reported as
mapped or not mapped, the mapped values in run.json and the cache config, the run.json valid for the
engine, the export's round trip, errors that name file, key and fix, the CLI that never overwrites, and the
import node. The fixtures (tests/fixtures/diffusion_pipe) are our own files that use every key of
diffusion-pipe's examples/main_example.toml, examples/dataset.toml and examples/wan_14b_min_vram.toml."""
from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from pack import REPO, load_pack

load_pack()
from PipeTrain.engine.config.checks import ConfigError  # noqa: E402
from PipeTrain.engine.config.run import RunConfig  # noqa: E402
from PipeTrain.engine.data.scan import DatasetSpec  # noqa: E402
from PipeTrain.engine.dpconfig import cli  # noqa: E402
from PipeTrain.engine.dpconfig.dataset_keys import spaced_ratios  # noqa: E402
from PipeTrain.engine.dpconfig.exporter import to_diffusion_pipe  # noqa: E402
from PipeTrain.engine.dpconfig.importer import from_diffusion_pipe  # noqa: E402
from PipeTrain.engine.dpconfig.report import MAPPED, NOT_MAPPED  # noqa: E402
from PipeTrain.engine.dpconfig.toml_text import toml_text  # noqa: E402

pytestmark = pytest.mark.core  # pure Python: also on ComfyUI 0.33
FIX = REPO / "tests" / "fixtures" / "diffusion_pipe"
PAIRS = [("hunyuan_main.toml", "images_dataset.toml"), ("wan_main.toml", "wan_dataset.toml")]
# The keys diffusion-pipe's three examples set at commit 8f83dbf2 (main_example.toml and wan_14b_min_vram.toml;
# dataset.toml), the fixtures must use each of them.
EXAMPLE_MAIN_KEYS = {
    "output_dir", "dataset", "epochs", "micro_batch_size_per_gpu", "pipeline_stages", "gradient_accumulation_steps",
    "gradient_clipping", "warmup_steps", "eval_every_n_epochs", "eval_before_first_step",
    "eval_micro_batch_size_per_gpu", "eval_gradient_accumulation_steps", "save_every_n_epochs",
    "checkpoint_every_n_minutes", "activation_checkpointing", "partition_method", "save_dtype", "caching_batch_size",
    "steps_per_print", "video_clip_mode", "blocks_to_swap", "model.type", "model.transformer_path", "model.vae_path",
    "model.llm_path", "model.clip_path", "model.ckpt_path", "model.dtype", "model.transformer_dtype",
    "model.timestep_sample_method", "adapter.type", "adapter.rank", "adapter.dtype", "optimizer.type", "optimizer.lr",
    "optimizer.betas", "optimizer.weight_decay", "optimizer.eps", "optimizer.stabilize", "monitoring.enable_wandb",
    "monitoring.wandb_api_key", "monitoring.wandb_tracker_name", "monitoring.wandb_run_name"}
EXAMPLE_DATASET_KEYS = {"resolutions", "enable_ar_bucket", "min_ar", "max_ar", "num_ar_buckets", "frame_buckets",
                        "directory[0].path", "directory[0].num_repeats"}


def toml_keys(path: Path) -> set[str]:
    """Every key of a TOML file, dotted as the report names them: tables' keys as table.key, the entries of an
    array of tables as name[i].key."""
    keys = set()
    for key, value in tomllib.loads(path.read_text()).items():
        if isinstance(value, dict):
            keys |= {f"{key}.{k}" for k in value}
        elif key == "directory":
            keys |= {f"{key}[{i}].{k}" for i, entry in enumerate(value) for k in entry}
        else:
            keys.add(key)
    return keys


def imported(main="hunyuan_main.toml", dataset=None, **kw):
    return from_diffusion_pipe(FIX / main, FIX / dataset if dataset else None, **kw)


def test_the_fixtures_use_every_key_of_diffusion_pipes_examples():
    main = toml_keys(FIX / "hunyuan_main.toml") | toml_keys(FIX / "wan_main.toml")
    assert EXAMPLE_MAIN_KEYS <= main, EXAMPLE_MAIN_KEYS - main
    data = toml_keys(FIX / "images_dataset.toml") | toml_keys(FIX / "wan_dataset.toml")
    assert EXAMPLE_DATASET_KEYS <= data, EXAMPLE_DATASET_KEYS - data


@pytest.mark.parametrize("main, dataset", PAIRS)
def test_every_key_is_reported_as_mapped_or_not_mapped(main, dataset):
    _, reports = imported(main, eval_cache_dir="/evals/cache")
    main_report, data_report = reports.parts
    for report, path in ((main_report, FIX / main), (data_report, FIX / dataset)):
        status = report.status()
        assert set(status) == toml_keys(path), set(status) ^ toml_keys(path)  # none dropped, none invented
        assert {k: s for k, s in status.items() if s not in (MAPPED, NOT_MAPPED)} == {}
        assert all(e.note for e in report.entries if e.status == NOT_MAPPED)  # each says why / what to do
    text = reports.text()
    assert "model.llm_path: not mapped" in text and "epochs: mapped -> train.epochs" in text or main == "wan_main.toml"


def test_mapped_values_land_in_run_json_and_the_cache_config():
    settings, _ = imported(eval_cache_dir="/evals/cache")
    run, cache = settings["run"], settings["cache"]
    t, m, lo = run["train"], run["memory"], run["lora"]
    assert (t["steps"], t["epochs"], t["batch_size"], t["grad_accum"], t["grad_clip"], t["warmup_steps"]) == \
        (3000, 40.0, 2, 4, 0.5, 50)
    assert (t["scheduler"], t["save_every"], t["learning_rate"], t["weight_decay"], t["timestep_sampling"]) == \
        ("cosine", 200, 5e-5, 0.05, "uniform")
    assert (m["pipeline_stages"], m["pipeline_split"], m["compile_blocks"], m["activation_checkpointing"]) == \
        (2, "12", True, "on")
    assert (m["base_dtype"], m["optimizer"], run["launch"]["num_gpus"]) == ("float8_e4m3fn", "adamw", 2)
    assert (lo["rank"], lo["dtype"], lo["targets"], lo["alpha"]) == (48, "float32", "all_linear", 0.0)
    assert lo["init_from"] == str(FIX / "runs" / "earlier_run" / "epoch20" / "adapter_model.safetensors")
    assert (run["eval"]["cache_dir"], run["eval"]["every"], run["eval"]["before_start"]) == ("/evals/cache", 250, False)
    assert run["model_path"] == str(FIX / "models" / "hunyuan_video_t2v_720p_bf16.safetensors")
    assert run["run_dir"] == str(FIX / "runs" / "hunyuan_main") and run["run_name"] == "hunyuan_main"
    assert cache["clip_type"] == "hunyuan_video" and cache["vae"].endswith("hunyuan_video_vae_bf16.safetensors")
    assert [Path(p).name for p in cache["clip"]] == ["clip_l.safetensors"]  # the llm folder is not a file
    d = cache["dataset"]
    assert (d["resolution"], d["extra_resolutions"], d["aspect_ratios"], d["frame_buckets"], d["tag_shuffles"]) == \
        (768, [1024], [1.0, 1.25, 0.75], [17, 49], 3)  # frame_buckets [1, 17, 49]: 1 is images, which always train
    assert d["clip_mode"] == "single_middle" and "video_frames" not in d  # video_clip_mode, from the main TOML
    # landscapes takes the top-level settings; portraits overrides resolutions, ar_buckets and frame_buckets, so
    # it is a dataset of its own chained to the first (LoadDataset's add_to), with its mask folder
    assert [(Path(f["path"]).name, f["repeats"]) for f in d["folders"]] == [("landscapes", 1)]
    (own,) = d["more"]
    assert [(Path(f["path"]).name, f["repeats"]) for f in own["folders"]] == [("portraits", 3)]
    assert (own["resolution"], own["extra_resolutions"], own["aspect_ratios"], own["frame_buckets"]) == \
        (640, [], [0.75], [])  # [[640, 640]]; [[480, 640]]; [1]: images only
    assert (own["tag_shuffles"], own["clip_mode"]) == (3, "single_middle")  # the rest as the top level says
    assert own["mask_folder"] == str(FIX / "data" / "portrait_masks") and "mask_folder" not in d


def test_the_wan_example_maps_its_memory_toolbox_and_asks_for_a_model_file():
    settings, reports = imported("wan_main.toml")
    run = settings["run"]
    assert (run["memory"]["activation_checkpointing"], run["memory"]["block_swap"], run["memory"]["optimizer"]) == \
        ("cpu_offload", 24, "adamw8bit_kahan")
    assert (run["train"]["steps"], run["train"]["epochs"], run["model_path"]) == (0, 12.0, "")
    assert settings["cache"]["dataset"]["frame_buckets"] == [33] and settings["cache"]["dataset"]["aspect_ratios"] == []
    assert settings["cache"]["dataset"]["clip_mode"] == "single_beginning"
    assert "single-file ComfyUI checkpoint" in reports.text() and "no single-file model" in reports.text()
    assert imported("wan_main.toml", model_path="/m/wan.safetensors")[0]["run"]["model_path"] == "/m/wan.safetensors"


def test_aspect_ratio_range_is_spaced_in_log_space(tmp_path):
    assert spaced_ratios(0.5, 2.0, 7) == [0.5, 0.6300, 0.7937, 1.0, 1.2599, 1.5874, 2.0]
    (tmp_path / "d.toml").write_text("resolutions = [512]\nenable_ar_bucket = true\nmin_ar = 0.5\nmax_ar = 2.0\n"
                                     "num_ar_buckets = 3\n[[directory]]\npath = 'x'\n")
    settings, reports = from_diffusion_pipe(FIX / "wan_main.toml", tmp_path / "d.toml")
    assert settings["cache"]["dataset"]["aspect_ratios"] == [0.5, 1.0, 2.0]
    assert reports.parts[1].status()["num_ar_buckets"] == MAPPED


def test_directories_with_their_own_buckets_and_a_batch_size_list_round_trip(tmp_path):
    (tmp_path / "d.toml").write_text("resolutions = [512, 1024]\nenable_ar_bucket = false\n"
                                     "[[directory]]\npath = 'cats'\n"
                                     "[[directory]]\npath = 'dogs'\nnum_repeats = 2\nresolutions = [768]\n"
                                     "enable_ar_bucket = true\nar_buckets = [1.0, 1.5]\nsize_buckets = [[512, 512, 1]]\n")
    main = (FIX / "wan_main.toml").read_text().replace("'wan_dataset.toml'", repr(str(tmp_path / "d.toml")))
    assert "\nmicro_batch_size_per_gpu = 1\n" in main
    (tmp_path / "main.toml").write_text(main.replace("\nmicro_batch_size_per_gpu = 1\n",
                                                     "\nmicro_batch_size_per_gpu = [[512, 4], [1024, 1], [768, 2]]\n"))
    settings, reports = from_diffusion_pipe(tmp_path / "main.toml")
    d, t = settings["cache"]["dataset"], settings["run"]["train"]
    assert [Path(f["path"]).name for f in d["folders"]] == ["cats"] and d["batch_sizes"] == [[512, 4], [1024, 1]]
    (dogs,) = d["more"]
    assert ([Path(f["path"]).name for f in dogs["folders"]], dogs["folders"][0]["repeats"], dogs["resolution"],
            dogs["aspect_ratios"], dogs["batch_sizes"]) == (["dogs"], 2, 768, [1.0, 1.5], [[768, 2]])
    assert t["batch_size"] == 1  # the smallest: for any resolution the list leaves out
    status = {e.key: e for e in reports.parts[1].entries}
    assert status["directory[1].resolutions"].status == MAPPED and status["directory[1].resolutions"].target == \
        "cache.dataset.more[0]"
    assert status["directory[1].size_buckets"].status == NOT_MAPPED  # said why, as at the top level
    assert reports.parts[0].status()["micro_batch_size_per_gpu"] == MAPPED
    assert "more_cache_dirs to the others" in reports.text()
    # export: the chained dataset's folders become directories with its own settings, batch_sizes the list
    main_text, data_text, _ = to_diffusion_pipe(settings["run"], settings["cache"], dataset_file=str(tmp_path / "o.toml"))
    (tmp_path / "o.toml").write_text(data_text)
    (tmp_path / "o_main.toml").write_text(main_text)
    assert tomllib.loads(main_text)["micro_batch_size_per_gpu"] == [[512, 4], [1024, 1], [768, 2]]
    again, _ = from_diffusion_pipe(tmp_path / "o_main.toml")
    same = [DatasetSpec.from_dict(x).to_dict() for x in (again["cache"]["dataset"], d)]  # written in other words
    assert same[0] == same[1] and again["run"]["train"] == t
    bad = main.replace("\nmicro_batch_size_per_gpu = 1\n", "\nmicro_batch_size_per_gpu = [[512, 4], 1024]\n")
    (tmp_path / "bad.toml").write_text(bad)
    with pytest.raises(ConfigError, match=r"micro_batch_size_per_gpu\[1\].*give \[resolution, batch size\] pairs"):
        from_diffusion_pipe(tmp_path / "bad.toml")


def test_the_written_run_json_loads_with_the_engines_loader(tmp_path):
    out = tmp_path / "run.json"
    assert cli.import_main(["--main", str(FIX / "hunyuan_main.toml"), "--out", str(out), "--comfyui-root", "/c",
                            "--cache-dir", str(tmp_path / "cache")]) == 0
    cfg = RunConfig.load(out)  # what `python -m engine` does on every rank
    assert cfg.lora.rank == 48 and cfg.cache_dir == str(tmp_path / "cache") and cfg.comfyui_root == "/c"
    assert json.loads((tmp_path / "cache.json").read_text())["dataset"]["resolution"] == 768


def test_export_then_import_keeps_the_mapped_settings(tmp_path):
    settings, _ = imported()
    main_text, data_text, reports = to_diffusion_pipe(settings["run"], settings["cache"],
                                                      dataset_file=str(tmp_path / "dataset.toml"))
    (tmp_path / "main.toml").write_text(main_text)
    (tmp_path / "dataset.toml").write_text(data_text)
    assert tomllib.loads(main_text)["optimizer"]["type"] == "adamw"
    assert tomllib.loads(main_text)["video_clip_mode"] == "single_middle"
    assert tomllib.loads(data_text)["frame_buckets"] == [1, 17, 49]
    again, _ = from_diffusion_pipe(tmp_path / "main.toml", run_name="hunyuan_main")
    first, second = settings["run"], again["run"]
    for section in ("train", "memory", "lora", "objective", "launch"):
        assert second[section] == first[section], section
    assert (second["run_dir"], second["model_path"]) == (first["run_dir"], first["model_path"])
    for key in ("clip_type", "vae"):
        assert again["cache"][key] == settings["cache"][key]
    assert again["cache"]["dataset"] == {k: v for k, v in settings["cache"]["dataset"].items()}
    status = reports.parts[0].status()
    assert status["train.learning_rate"] == MAPPED and status["memory.pipeline_split"] == MAPPED


def test_export_reads_the_dataset_from_the_cache_manifest_and_names_what_it_cannot_map(tmp_path):
    settings, _ = imported("wan_main.toml", model_path="/m/wan.safetensors")
    run = {**settings["run"], "cache_dir": str(tmp_path), "objective": {"loss": "huber"}}
    (tmp_path / "manifest.json").write_text(json.dumps({"dataset": settings["cache"]["dataset"]}))
    main_text, data_text, reports = to_diffusion_pipe(run, model_type="wan")
    assert tomllib.loads(data_text)["directory"][0]["num_repeats"] == 2
    assert tomllib.loads(main_text)["model"]["transformer_path"] == "/m/wan.safetensors"
    assert reports.parts[0].status()["objective.loss"] == NOT_MAPPED
    with pytest.raises(ConfigError, match="model-type"):
        to_diffusion_pipe(run)


def _variant(tmp_path, old: str, new: str) -> Path:
    text = (FIX / "wan_main.toml").read_text()
    assert old in text
    path = tmp_path / "main.toml"
    path.write_text(text.replace(old, new).replace("'wan_dataset.toml'", repr(str(FIX / "wan_dataset.toml"))))
    return path


@pytest.mark.parametrize("old, new, words", [
    ("type = 'wan'", "type = 'wan3'", ["model.type", "'wan3'", "use one of"]),
    ("rank = 16", "rank = 'big'", ["adapter.rank", "whole number"]),
    ("rank = 16", "rank = 1e6", ["lora.rank is 1000000", "between 1 and 1024"]),
    ("type = 'lora'", "type = 'glora'", ["adapter.type", "set type = 'lora'"]),
    ("activation_checkpointing = 'unsloth'", "activation_checkpointing = 'sometimes'",
     ["activation_checkpointing", "'unsloth'"]),
    ("lr = 4e-5", "lr = 3.0", ["learning_rate 3", "adamw8bit_kahan"]),
    ("epochs = 12", "epochs = [12", ["not valid TOML"]),
    ("[optimizer]", "[optimiser]", ["[optimizer]", "is missing"]),
    ("video_clip_mode = 'single_beginning'", "video_clip_mode = 'random'",
     ["video_clip_mode", "'random'", "multiple_overlapping"]),
])
def test_bad_values_are_refused_naming_the_file_key_and_fix(tmp_path, old, new, words):
    path = _variant(tmp_path, old, new)
    with pytest.raises(ConfigError) as e:
        from_diffusion_pipe(path)
    assert str(path) in str(e.value)
    for w in words:
        assert w in str(e.value)


def test_a_lokr_adapter_maps_where_pipetrain_trains_lokr(tmp_path):
    from PipeTrain.engine.dpconfig.main_keys import adapter_kinds

    path = _variant(tmp_path, "type = 'lora'\nrank = 16", "type = 'lokr'\nrank = 8\ndecompose_factor = 4")
    if "lokr" not in adapter_kinds():  # a PipeTrain without LoKr refuses it with the fix
        with pytest.raises(ConfigError, match="set type = 'lora'"):
            from_diffusion_pipe(path)
        return
    settings, reports = from_diffusion_pipe(path)
    lora = settings["run"]["lora"]
    assert (lora["kind"], lora["rank"], lora["lokr_factor"]) == ("lokr", 8, 4)
    assert reports.parts[0].status()["adapter.decompose_factor"] == MAPPED
    main_text, _, _ = to_diffusion_pipe(settings["run"], settings["cache"])
    adapter = tomllib.loads(main_text)["adapter"]
    assert adapter == {"type": "lokr", "decompose_factor": 4, "rank": 8, "dtype": "bfloat16"}


def test_a_missing_file_is_named():
    with pytest.raises(ConfigError, match="nowhere.toml does not exist"):
        from_diffusion_pipe(FIX / "nowhere.toml")
    with pytest.raises(ConfigError, match="dataset TOML .*missing.toml does not exist"):
        from_diffusion_pipe(FIX / "wan_main.toml", FIX / "missing.toml")


def test_the_cli_never_overwrites_without_force(tmp_path, capsys):
    args = ["--main", str(FIX / "wan_main.toml"), "--out", str(tmp_path / "run.json")]
    assert cli.import_main(args) == 0
    assert "[next steps]" in capsys.readouterr().out
    (tmp_path / "run.json").write_text("mine")
    assert cli.import_main(args) == 2
    assert "already exist" in capsys.readouterr().err and (tmp_path / "run.json").read_text() == "mine"
    assert cli.import_main(args + ["--force"]) == 0 and (tmp_path / "run.json").read_text() != "mine"
    out = tmp_path / "dp"
    export = [str(tmp_path / "run.json"), "--out-dir", str(out), "--cache-config", str(tmp_path / "cache.json")]
    assert cli.export_main(export) == 0 and tomllib.loads((out / "main.toml").read_text())["model"]["type"] == "wan"
    assert cli.export_main(export) == 2 and "--force" in capsys.readouterr().err
    assert not list(out.glob(".*tmp*"))  # temp-then-rename leaves no temp file behind


def test_python_dash_m_engine_dispatches_import_dp(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "engine", "import-dp", "--main", str(FIX / "wan_main.toml"),
                           "--out", str(tmp_path / "run.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "blocks_to_swap: mapped -> memory.block_swap" in proc.stdout
    assert "torch" not in proc.stderr


def test_toml_writer_output_reads_back():
    data = {"a": "it's \\ here", "b": 1.0, "c": [1, [2, 3]], "d": True, "t": {"x": 1e-8},
            "directory": [{"path": "C:\\data"}, {"path": "b"}]}
    assert tomllib.loads(toml_text(data, "a header")) == data


def test_the_node_gives_pipetrain_settings_and_the_report():
    from PipeTrain import NODE_CLASS_MAPPINGS
    from PipeTrain.engine.config.sections import LoraSpec, MemorySpec
    from PipeTrain.nodes.import_diffusion_pipe import PipeTrainImportDiffusionPipeConfig as Node

    assert NODE_CLASS_MAPPINGS["PipeTrainImportDiffusionPipeConfig"] is Node
    assert all(opts.get("tooltip") for _, opts in Node.INPUT_TYPES()["required"].values())
    assert (REPO / "web" / "docs" / "PipeTrainImportDiffusionPipeConfig.md").is_file()
    out = Node().load(str(FIX / "wan_main.toml"), "")
    result = dict(zip(Node.RETURN_NAMES, out))
    assert isinstance(result["lora"], LoraSpec) and result["lora"].rank == 16
    assert isinstance(result["memory"], MemorySpec) and result["memory"].block_swap == 24
    assert result["dataset"].clip_lengths == (33,) and result["epochs"] == 12.0 and result["learning_rate"] == 4e-5
    assert "stabilize: not mapped" in result["report"] and "timestep_sampling = 'logit_normal'" in result["report"]
    assert len(out) == len(Node.RETURN_TYPES) == len(Node.OUTPUT_TOOLTIPS)
    with pytest.raises(ConfigError, match="does not exist"):
        Node().load(str(FIX / "nope.toml"), "")
