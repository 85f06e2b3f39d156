"""Full fine-tune (lora.kind = "full", engine/train/full_tune.py) in parts: gradients reach float32 master weights
through ComfyUI's casting layers, fp8 weights and the combinations it cannot train are refused with the fix,
and PipeTrain Save Model writes a file (bf16 or fp8) that ComfyUI's own loader loads, never overwriting unasked.
The whole run through the engine is tests/training/test_full_finetune.py."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from torch import nn

from PipeTrain.engine.config.checks import ConfigError
from PipeTrain.engine.config.launch import LaunchSpec
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import LoraSpec, MemorySpec, TrainSpec

pytestmark = pytest.mark.core


@pytest.fixture(scope="module")
def comfy(comfy_root):
    from PipeTrain.engine.launch.comfy_bootstrap import import_comfy

    import_comfy(comfy_root)


def _toy(ops, dtype):
    """An embedder and two blocks of ComfyUI layers, weights in `dtype`."""
    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = ops.LayerNorm(8, dtype=dtype)
            self.attn_q = ops.Linear(8, 8, dtype=dtype)
            self.mlp = ops.Linear(8, 8, dtype=dtype)

        def forward(self, x):
            return x + self.mlp(torch.relu(self.attn_q(self.norm(x))))

    class Toy(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = ops.Linear(8, 8, dtype=dtype)
            self.blocks = nn.ModuleList([Block(), Block()])

        def forward(self, x):
            x = self.embed(x)
            for block in self.blocks:
                x = block(x)
            return x

    model = Toy()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.3 + (p.dim() == 1))
    return model


@pytest.mark.parametrize("ops_name", ["manual_cast", "disable_weight_init"])
def test_gradients_reach_float32_master_weights_through_comfy_ops(comfy, ops_name):
    import comfy.ops

    from PipeTrain.engine.train.full_tune import unfreeze_blocks
    from PipeTrain.engine.train.lora import trained_parameters

    spec = LoraSpec(targets="all_linear", kind="full")
    model = _toy(getattr(comfy.ops, ops_name), torch.bfloat16)
    names = unfreeze_blocks(model, spec)
    assert set(names) == {n for n, _ in model.named_parameters() if n.startswith("blocks.")}
    assert set(trained_parameters(model, spec)) == set(names)
    out = model(torch.randn(3, 8, dtype=torch.bfloat16))
    assert out.dtype == torch.bfloat16  # the layers compute in the activations' dtype
    out.float().square().mean().backward()
    for name, param in model.named_parameters():
        if name in names:
            assert param.dtype == torch.float32 and param.grad is not None and param.grad.abs().sum() > 0, name
        else:
            assert param.dtype == torch.bfloat16 and param.grad is None, name


@pytest.mark.parametrize("optimizer,dtype", [("adamw_cpu_offload", "float32"), ("adamw8bit_kahan", "bfloat16")])
def test_memory_saving_optimizers_train_the_block_weights(comfy, optimizer, dtype):
    import comfy.ops

    from PipeTrain.engine.train.full_tune import unfreeze_blocks
    from PipeTrain.engine.train.lora import trained_parameters
    from PipeTrain.engine.train.optimizers import build_optimizer

    spec = LoraSpec(targets="all_linear", kind="full", dtype=dtype)
    model = _toy(comfy.ops.manual_cast, torch.bfloat16)
    unfreeze_blocks(model, spec)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(optimizer, list(trained_parameters(model, spec).values()),
                          TrainSpec(learning_rate=1e-2, weight_decay=0.0))
    x, target = torch.randn(16, 8, dtype=torch.bfloat16), torch.zeros(16, 8)
    losses = []
    for _ in range(8):
        loss = (model(x).float() - target).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[-1] < 0.8 * losses[0], losses
    moved = {n for n, p in model.named_parameters() if not torch.equal(p.detach(), before[n])}
    assert moved == set(trained_parameters(model, spec)), moved ^ set(trained_parameters(model, spec))


def test_presets_and_regex_pick_the_block_weights(comfy):
    import comfy.ops

    from PipeTrain.engine.train.full_tune import select_full_params

    model = _toy(comfy.ops.disable_weight_init, torch.float32)
    assert select_full_params(model, LoraSpec(kind="full", targets="attention")) == [
        "blocks.0.attn_q.weight", "blocks.0.attn_q.bias", "blocks.1.attn_q.weight", "blocks.1.attn_q.bias"]
    assert select_full_params(model, LoraSpec(kind="full", targets="all_linear", target_regex=r"^blocks\.1\.norm")) \
        == ["blocks.1.norm.weight", "blocks.1.norm.bias"]
    with pytest.raises(ConfigError, match="no weight of this model's blocks matches the regex 'nothing'"):
        select_full_params(model, LoraSpec(kind="full", targets="all_linear", target_regex="nothing"))


def test_fp8_weights_are_refused(comfy):
    import comfy.ops

    from PipeTrain.engine.train.full_tune import unfreeze_blocks

    model = _toy(comfy.ops.manual_cast, torch.float8_e4m3fn)
    with pytest.raises(ConfigError, match=r"stored as torch.float8_e4m3fn.*Use the bf16 or fp16 model file"):
        unfreeze_blocks(model, LoraSpec(kind="full", targets="all_linear"))


FULL = LoraSpec(kind="full")


@pytest.mark.parametrize("change,needle", [
    (dict(memory=MemorySpec(base_dtype="float8_e4m3fn")), "cannot train fp8 weights (memory.base_dtype"),
    (dict(memory=MemorySpec(block_swap=4)), "does not work with block swap yet (memory.block_swap 4"),
    (dict(lora=dataclasses.replace(FULL, init_from="a.safetensors")), "kind 'full' trains the model itself"),
])
def test_what_a_full_finetune_cannot_do_is_refused_with_the_fix(change, needle):
    cfg = RunConfig(run_name="r", run_dir="x", comfyui_root="c", model_path="m", cache_dir="d", lora=FULL,
                    launch=LaunchSpec(num_gpus=2))
    cfg.validate()
    with pytest.raises(ConfigError, match=re.escape(needle)):
        dataclasses.replace(cfg, **change).validate()
    if "lora" not in change:  # a LoRA run takes the same settings
        dataclasses.replace(cfg, lora=LoraSpec(), **change).validate()


def test_a_full_finetune_takes_pipeline_stages():
    """Each stage trains its own blocks (tests/training/test_pipeline_full_finetune.py runs it)."""
    cfg = RunConfig(run_name="r", run_dir="x", comfyui_root="c", model_path="m", cache_dir="d", lora=FULL,
                    memory=MemorySpec(pipeline_stages=2), launch=LaunchSpec(num_gpus=2))
    cfg.validate()


@pytest.fixture
def finished_run(comfy, tmp_path):
    """A RunResult whose run folder holds model/model_final.safetensors: the tiny UNet in bf16 (as the engine
    writes it), and the models folder Save Model writes into."""
    from safetensors.torch import save_file

    from PipeTrain.nodes.runs import RunResult
    from tools.tiny_models import build_tiny_unet

    sd = {k: v.to(torch.bfloat16) for k, v in build_tiny_unet(0).state_dict().items()}
    (tmp_path / "run" / "model").mkdir(parents=True)
    save_file(sd, str(tmp_path / "run" / "model" / "model_final.safetensors"), metadata={"pipetrain_adapter": "full"})
    return RunResult(run_dir=str(tmp_path / "run"), run_name="run", lora_path="", steps=6, total_steps=6,
                     final_loss=0.1, model_name="tiny.safetensors", status="done"), sd


def _denoise(patcher) -> torch.Tensor:
    x = torch.randn((1, 4, 8, 8), generator=torch.Generator().manual_seed(0))
    context = torch.randn((1, 77, 768), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return patcher.model.apply_model(x, torch.tensor([5.0]), c_crossattn=context).float()


def test_save_model_writes_loadable_files_and_never_overwrites_unasked(finished_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from PipeTrain.nodes import compat
    from PipeTrain.nodes.save_model import PipeTrainSaveModel

    run, sd = finished_run
    monkeypatch.setattr(compat, "first_folder", lambda folder: str(tmp_path / "models" / folder))
    from PipeTrain.nodes.runs import summary_text

    assert "\nmodel: " in summary_text(run) and summary_text(run).count("model_final.safetensors") == 1
    node = PipeTrainSaveModel()
    assert all(opts.get("tooltip") for _, opts in PipeTrainSaveModel.INPUT_TYPES()["required"].values())
    out = node.save(run, "people/anna", overwrite=False)
    model, name = out["result"]
    assert name.replace("\\", "/") == "pipetrain/people/anna.safetensors"
    target = tmp_path / "models" / "diffusion_models" / "pipetrain" / "people" / "anna.safetensors"
    written = load_file(str(target))
    assert written.keys() == sd.keys() and all(torch.equal(written[k], sd[k]) for k in sd)
    assert not list(target.parent.glob(".*tmp*"))  # the temporary file was renamed
    bf16_out = _denoise(model)

    with pytest.raises(ConfigError, match="already exists: choose another name, or turn on overwrite"):
        node.save(run, "people/anna", overwrite=False, dtype="float8_e4m3fn")
    assert load_file(str(target)).keys() == sd.keys() and written["out.2.weight"].dtype == torch.bfloat16
    fp8_model, _ = node.save(run, "people/anna", overwrite=True, dtype="float8_e4m3fn")["result"]
    fp8 = load_file(str(target))
    assert fp8["out.2.weight"].dtype == torch.float8_e4m3fn  # a conv weight
    assert all(t.dtype == torch.bfloat16 for k, t in fp8.items() if t.dim() == 1)  # norms and biases
    loaded = fp8_model.model.diffusion_model.state_dict()  # ComfyUI's loader keeps the file's fp8 weights
    assert all(torch.equal(loaded[k].float(), fp8[k].float()) for k in fp8), \
        {str(loaded[k].dtype) for k in fp8 if not torch.equal(loaded[k].float(), fp8[k].float())}
    fp8_out = _denoise(fp8_model)  # and computes with them in a higher precision
    # 3 mantissa bits (and this tiny model's small weights near fp8's subnormals): about 10% off here
    assert torch.isfinite(fp8_out).all() and (fp8_out - bf16_out).norm() / bf16_out.norm() < 0.2


def test_save_model_takes_the_ema_model_and_refuses_it_where_the_run_kept_none(finished_run, tmp_path, monkeypatch):
    from safetensors.torch import load_file, save_file

    from PipeTrain.nodes import compat
    from PipeTrain.nodes.save_model import PipeTrainSaveModel

    run, sd = finished_run
    monkeypatch.setattr(compat, "first_folder", lambda folder: str(tmp_path / "models" / folder))
    assert PipeTrainSaveModel.INPUT_TYPES()["optional"]["weights"][1]["tooltip"]
    with pytest.raises(ConfigError, match="kept no EMA weights .*model_final_ema.safetensors.*ema_decay above 0"):
        PipeTrainSaveModel().save(run, "anna", overwrite=False, weights="ema")
    averaged = {k: v * 0.5 for k, v in sd.items()}
    save_file(averaged, str(tmp_path / "run" / "model" / "model_final_ema.safetensors"))
    PipeTrainSaveModel().save(run, "anna", overwrite=False, weights="ema")
    written = load_file(str(tmp_path / "models" / "diffusion_models" / "pipetrain" / "anna.safetensors"))
    assert all(torch.equal(written[k], averaged[k]) for k in sd)
    PipeTrainSaveModel().save(run, "anna_plain", overwrite=False)  # plain: the model file, not the EMA beside it
    written = load_file(str(tmp_path / "models" / "diffusion_models" / "pipetrain" / "anna_plain.safetensors"))
    assert all(torch.equal(written[k], sd[k]) for k in sd)


def test_save_model_refuses_a_lora_run(finished_run, tmp_path, monkeypatch):
    import shutil

    from PipeTrain.nodes import compat
    from PipeTrain.nodes.save_model import PipeTrainSaveModel

    run, _ = finished_run
    shutil.rmtree(tmp_path / "run" / "model")
    monkeypatch.setattr(compat, "first_folder", lambda folder: str(tmp_path / "models" / folder))
    with pytest.raises(ConfigError, match="it trained a LoRA, so save it with PipeTrain Save LoRA"):
        PipeTrainSaveModel().save(run, "x", overwrite=False)
