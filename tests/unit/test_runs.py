"""Run folders and LoRA names: never overwrite, never escape."""
import pytest

from PipeTrain.engine.config.checks import ConfigError, check_run_name
from PipeTrain.nodes.runs import new_run_dir, resumable_runs, resume_run_dir
from PipeTrain.nodes.save_lora import safe_lora_target


def test_new_run_never_reuses_a_folder(tmp_path):
    a = new_run_dir(str(tmp_path), "demo")
    b = new_run_dir(str(tmp_path), "demo")
    c = new_run_dir(str(tmp_path), "demo")
    assert [a.name, b.name, c.name] == ["demo", "demo_2", "demo_3"]


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "x" * 200])
def test_bad_run_names(tmp_path, name):
    with pytest.raises(ConfigError, match="run_name"):
        new_run_dir(str(tmp_path), name)


def test_resume_picks_runs_with_checkpoints(tmp_path):
    with pytest.raises(ConfigError, match="no run .* has a checkpoint"):
        resume_run_dir(str(tmp_path), "latest")
    run = new_run_dir(str(tmp_path), "r")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step000010")
    assert resumable_runs(str(tmp_path)) == ["r"]
    assert resume_run_dir(str(tmp_path), "latest") == run
    with pytest.raises(ConfigError, match="has no checkpoint"):
        resume_run_dir(str(tmp_path), "other")


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/abs", "C:/x", "..", " "])
def test_lora_names_that_escape_are_refused(tmp_path, name):
    with pytest.raises(ConfigError, match="not allowed|outside"):
        safe_lora_target(str(tmp_path), name)


@pytest.mark.parametrize("name, needle", [(".", "plain name"), ("./", "plain name"), ("a/./b", "plain name"),
                                          ("evil\u202egnp", r"U\+202E"), ("my\nlora", r"U\+000A"),
                                          ("my_lora\n", r"U\+000A"), ("zero\u200bwidth", r"U\+200B")])
def test_lora_names_that_hide_or_name_no_file_are_refused(tmp_path, name, needle):
    """'.' named no file (an IndexError before); bidi overrides and line breaks show another name."""
    with pytest.raises(ConfigError, match=needle):
        safe_lora_target(str(tmp_path), name)


@pytest.mark.parametrize("name", ["run\u202e", "a\nb"])
def test_run_names_with_invisible_characters_are_refused(name):
    with pytest.raises(ConfigError, match="run_name"):
        check_run_name(name)


def test_lora_names_land_in_pipetrain_folder(tmp_path):
    assert safe_lora_target(str(tmp_path), "style") == (tmp_path / "pipetrain" / "style.safetensors").resolve()
    assert safe_lora_target(str(tmp_path), "people/anna.safetensors") == \
        (tmp_path / "pipetrain" / "people" / "anna.safetensors").resolve()
