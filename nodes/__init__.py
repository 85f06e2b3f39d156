"""PipeTrain's ComfyUI nodes (V1 API). Thin classes: validation and I/O; training is in engine/."""
from .cache_latents import PipeTrainCacheLatents
from .cluster import PipeTrainCluster
from .configure_lora import PipeTrainConfigureLoRA
from .import_diffusion_pipe import PipeTrainImportDiffusionPipeConfig
from .load_dataset import PipeTrainLoadDataset
from .lora_grid import PipeTrainLoRAGrid
from .memory_options import PipeTrainMemoryOptions
from .objective_options import PipeTrainObjectiveOptions
from .run_plots import PipeTrainLossPlot, PipeTrainSampleGrid
from .save_lora import PipeTrainSaveLoRA
from .save_model import PipeTrainSaveModel
from .train_options import PipeTrainTrainOptions
from .train_pipeline import PipeTrainTrainPipeline
from .wan_experts import PipeTrainWanExperts

NODE_CLASS_MAPPINGS = {
    "PipeTrainLoadDataset": PipeTrainLoadDataset,
    "PipeTrainCacheLatents": PipeTrainCacheLatents,
    "PipeTrainConfigureLoRA": PipeTrainConfigureLoRA,
    "PipeTrainMemoryOptions": PipeTrainMemoryOptions,
    "PipeTrainObjectiveOptions": PipeTrainObjectiveOptions,
    "PipeTrainTrainPipeline": PipeTrainTrainPipeline,
    "PipeTrainTrainOptions": PipeTrainTrainOptions,
    "PipeTrainCluster": PipeTrainCluster,
    "PipeTrainSaveLoRA": PipeTrainSaveLoRA,
    "PipeTrainSaveModel": PipeTrainSaveModel,
    "PipeTrainLossPlot": PipeTrainLossPlot,
    "PipeTrainSampleGrid": PipeTrainSampleGrid,
    "PipeTrainLoRAGrid": PipeTrainLoRAGrid,
    "PipeTrainImportDiffusionPipeConfig": PipeTrainImportDiffusionPipeConfig,
    "PipeTrainWanExperts": PipeTrainWanExperts,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "PipeTrainLoadDataset": "PipeTrain Load Dataset",
    "PipeTrainCacheLatents": "PipeTrain Cache Latents",
    "PipeTrainConfigureLoRA": "PipeTrain Configure LoRA",
    "PipeTrainMemoryOptions": "PipeTrain Memory Options",
    "PipeTrainObjectiveOptions": "PipeTrain Objective Options",
    "PipeTrainTrainPipeline": "PipeTrain Train Pipeline",
    "PipeTrainTrainOptions": "PipeTrain Train Options",
    "PipeTrainCluster": "PipeTrain Cluster (multi-node)",
    "PipeTrainSaveLoRA": "PipeTrain Save LoRA",
    "PipeTrainSaveModel": "PipeTrain Save Model",
    "PipeTrainLossPlot": "PipeTrain Loss Plot",
    "PipeTrainSampleGrid": "PipeTrain Sample Grid",
    "PipeTrainLoRAGrid": "PipeTrain LoRA Grid",
    "PipeTrainImportDiffusionPipeConfig": "PipeTrain Import diffusion-pipe Config",
    "PipeTrainWanExperts": "PipeTrain Wan 2.2 Experts",
}
