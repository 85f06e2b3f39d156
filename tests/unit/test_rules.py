"""The rules that join settings (engine/config/rules.py, and check_block_swap in engine/config/checks.py):
each refusal names the setting and the fix, and every place that applies a rule calls the one function
(the optimizer rules: tests/unit/test_optimizers.py)."""
import pytest
import torch

from PipeTrain.engine.config.checks import ConfigError, check_block_swap
from PipeTrain.engine.config.launch import ClusterSpec, LaunchSpec
from PipeTrain.engine.config.rules import check_pipeline_backend, data_parallel_size
from PipeTrain.engine.config.run import RunConfig
from PipeTrain.engine.config.sections import MemorySpec


@pytest.mark.parametrize("gpus,stages,nodes,replicas", [(1, 1, 1, 1), (4, 2, 1, 2), (8, 4, 2, 2), (6, 3, 3, 2)])
def test_data_parallel_size_is_gpus_over_stages(gpus, stages, nodes, replicas):
    assert data_parallel_size(gpus, stages, nodes) == replicas


@pytest.mark.parametrize("gpus,stages,nodes,where", [
    (3, 2, 1, "3 GPUs cannot be split into 2 pipeline stages"),
    (6, 4, 3, r"6 GPUs \(3 nodes x 2\) cannot be split into 4 pipeline stages"),
    (5, 2, 2, "5 GPUs cannot be split"),  # ranks that do not share out evenly over the nodes
])
def test_gpus_that_do_not_divide_into_the_stages_are_refused(gpus, stages, nodes, where):
    with pytest.raises(ConfigError, match=where) as err:
        data_parallel_size(gpus, stages, nodes)
    assert "divisible by pipeline_stages" in str(err.value) and "memory.pipeline_stages" in str(err.value)
    assert "launch.num_gpus" in str(err.value)


def test_block_swap_needs_one_stage():
    check_block_swap(4, 1)
    check_block_swap(0, 2)
    with pytest.raises(ConfigError, match="memory.block_swap is 4 with pipeline_stages 2.*set block_swap to 0 or "
                                          "pipeline_stages to 1"):
        check_block_swap(4, 2)


def test_pipeline_stages_need_deepspeed():
    check_pipeline_backend(MemorySpec(pipeline_stages=2), LaunchSpec(num_gpus=2))
    check_pipeline_backend(MemorySpec(), LaunchSpec(backend="plain"))
    with pytest.raises(ConfigError, match="memory.pipeline_stages 2 needs DeepSpeed.*launch.backend 'plain'.*"
                                          "set pipeline_stages to 1"):
        check_pipeline_backend(MemorySpec(pipeline_stages=2), LaunchSpec(backend="plain"))


def test_the_sections_and_the_engine_apply_the_same_rules():
    """MemorySpec.validate and apply_memory_options refuse block swap on stages with one message;
    RunConfig.validate and the cluster plan refuse GPUs that do not divide with one message."""
    from PipeTrain.engine.launch import cluster
    from PipeTrain.engine.memory.options import apply_memory_options

    spec = MemorySpec(block_swap=2, pipeline_stages=2)
    with pytest.raises(ConfigError) as from_section:
        spec.validate()
    model = torch.nn.Module()
    model.diffusion_model = torch.nn.Module()
    with pytest.raises(ConfigError) as from_engine:
        apply_memory_options(model, spec, None)
    assert str(from_section.value) == str(from_engine.value)

    launch = LaunchSpec(num_gpus=2, cluster=ClusterSpec(num_nodes=3, no_ssh=True, master_addr="10.0.0.1"))
    cfg = RunConfig(run_name="r", run_dir="/none", comfyui_root="/none", model_path="/none.safetensors",
                    cache_dir="/none", launch=launch, memory=MemorySpec(pipeline_stages=4))
    with pytest.raises(ConfigError) as from_config:
        cfg.validate()  # no file is read: the paths need not exist
    with pytest.raises(ConfigError) as from_plan:
        cluster.plan(cfg)
    assert str(from_plan.value) == str(from_config.value)
